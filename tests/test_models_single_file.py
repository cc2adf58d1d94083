"""Single checkpoint files in the original layout load offline, as users have them.

Tiny SD 1.x, SD 2.x and SDXL models with random weights in every parameter (so a swapped pair of
same-shaped tensors cannot pass) are written with the project's own exporter and loaded back
through ``load_base_model`` with the tiny model's folder as ``model.config_dir``. Every socket is
closed for the whole module: nothing may reach the network.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from train_helpers import randomize

from trainer.config import ModelSection
from trainer.families.sd import single_file
from trainer.families.sd.checkpoint import ldm_state_dict, save_checkpoint
from trainer.families.sd.tiny import (
    build_components,
    build_sd2_components,
    build_sdxl_components,
    save_tiny_model,
)
from trainer.models.loader import ModelLoadError, load_base_model
from trainer.models.streamed_load import SafetensorsReader

BUILDERS = {"sd1": build_components, "sd2": build_sd2_components, "sdxl": build_sdxl_components}
MODULES = ("unet", "vae", "text_encoder", "text_encoder_2")


pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> (folder with configs and tokenizers, randomized modules)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for family, build in BUILDERS.items():
        folder = save_tiny_model(root / family, family=family)
        parts = build()
        modules = {k: randomize(parts[k], i) for i, k in enumerate(MODULES) if k in parts}
        out[family] = (folder, modules)
    return out


def write(path, family, modules, dtype=torch.float32, **kw):
    return save_checkpoint(path, **modules, family=family, dtype=dtype, **kw)


def load(path, folder, **settings):
    section = ModelSection(pretrained_model_name_or_path=str(path), config_dir=str(folder),
                           tokenizer=str(folder), **settings)
    return load_base_model(section)


def assert_same_weights(model, modules, convert=lambda t: t):
    for name, module in modules.items():
        got, want = getattr(model, name).state_dict(), module.state_dict()
        assert sorted(got) == sorted(want), name
        for key, tensor in want.items():
            assert got[key].dtype == torch.float32, (name, key)
            assert torch.equal(got[key], convert(tensor)), (name, key)


@pytest.mark.parametrize("family, label, pad", [
    ("sd1", "SD 1.x, epsilon", "<|endoftext|>"),
    ("sd2", "SD 2.x, v-prediction", "!"),
    ("sdxl", "SDXL, epsilon", "<|endoftext|>"),
])
def test_each_family_loads_offline_with_the_same_weights(tiny, tmp_path, family, label, pad):
    folder, modules = tiny[family]
    model = load(write(tmp_path / "m.safetensors", family, modules), folder)
    assert_same_weights(model, modules)
    assert model.version == family and model.name == "m"
    assert model.description.startswith(f"{label}, 128 (")
    assert model.prediction_type == model.noise_scheduler.config.prediction_type
    assert model.tokenizer.pad_token == pad and model.tokenizer.model_max_length == 77
    if family == "sdxl":
        assert model.tokenizer_2.pad_token == "!"
        assert model.text_encoder_2.config.hidden_size == 48
    else:
        assert model.text_encoder_2 is None and model.tokenizer_2 is None


def test_fp16_file_loads_as_fp32(tiny, tmp_path):
    folder, modules = tiny["sd1"]
    model = load(write(tmp_path / "half.safetensors", "sd1", modules, torch.float16), folder)
    assert_same_weights(model, modules, lambda t: t.half().float())
    assert "F16 weights" in model.description


def test_ema_keys_are_never_read(tiny, tmp_path, monkeypatch):
    folder, modules = tiny["sd2"]
    tensors = ldm_state_dict(**modules, family="sd2")
    for key in [k for k in tensors if k.startswith("model.diffusion_model.")]:
        flat = "model_ema." + key[len("model."):].replace(".", "")
        tensors[flat] = torch.full_like(tensors[key], 7.0)
    path = tmp_path / "with_ema.safetensors"
    save_file(tensors, str(path))
    read = []
    original = single_file.Checkpoint.take
    monkeypatch.setattr(single_file.Checkpoint, "take",
                        lambda self, prefix: read.extend(r := original(self, prefix)) or r)
    streamed = SafetensorsReader.read  # the parts read tensor by tensor (issue 20)
    monkeypatch.setattr(SafetensorsReader, "read",
                        lambda self, key: read.append(key) or streamed(self, key))
    model = load(path, folder)
    assert_same_weights(model, modules)
    assert read and not any(k.startswith("model_ema.") for k in read)
    ema = sum(k.startswith("model_ema.") for k in tensors)
    assert f"{ema} model_ema.* keys ignored" in model.description


def test_file_without_vae_needs_model_vae(tiny, tmp_path):
    folder, modules = tiny["sd1"]
    tensors = ldm_state_dict(**modules)
    vae_only = {k[len("first_stage_model."):]: tensors.pop(k) for k in list(tensors)
                if k.startswith("first_stage_model.")}
    path = tmp_path / "no_vae.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError, match=r"holds no VAE.*set model\.vae"):
        load(path, folder)
    other_vae = randomize(build_components()["vae"], 11)
    other_vae.save_pretrained(tmp_path / "vae_folder")
    model = load(path, folder, vae=str(tmp_path / "vae_folder"))
    assert_same_weights(model, {"vae": other_vae, "unet": modules["unet"]})
    assert "VAE from model.vae" in model.description
    # a VAE file in the original layout (no first_stage_model. prefix), read with the configs
    save_file(vae_only, str(tmp_path / "vae.safetensors"))
    model = load(path, folder, vae=str(tmp_path / "vae.safetensors"))
    assert_same_weights(model, {"vae": modules["vae"]})


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_ckpt_with_tensors_in_a_state_dict_wrapper_loads(tiny, tmp_path, zip_format):
    folder, modules = tiny["sd2"]
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": ldm_state_dict(**modules, family="sd2"), "global_step": 12,
                "epoch": 3}, str(path), _use_new_zipfile_serialization=zip_format)
    model = load(path, folder)
    assert_same_weights(model, modules)
    assert model.version == "sd2" and model.name == "model"


class TrainingCallback:  # stands for the code a pickle may need, e.g. a Lightning callback
    pass


def test_model_vae_replaces_the_files_own_without_reading_it(tiny, tmp_path, monkeypatch):
    folder, modules = tiny["sd1"]
    path = write(tmp_path / "m.safetensors", "sd1", modules)
    other_vae = randomize(build_components()["vae"], 12)
    other_vae.save_pretrained(tmp_path / "vae_folder")
    prefixes = []
    original = single_file.Checkpoint.take
    monkeypatch.setattr(single_file.Checkpoint, "take",
                        lambda self, prefix: prefixes.append(prefix) or original(self, prefix))
    model = load(path, folder, vae=str(tmp_path / "vae_folder"))
    assert_same_weights(model, {"vae": other_vae, "unet": modules["unet"]})
    assert "first_stage_model." not in prefixes and "VAE from model.vae" in model.description


def test_config_dir_without_a_scheduler_takes_the_familys_schedule(tiny, tmp_path):
    import shutil

    folder, modules = tiny["sd1"]
    configs = shutil.copytree(folder, tmp_path / "configs", ignore=shutil.ignore_patterns(
        "scheduler"))
    model = load(write(tmp_path / "m.safetensors", "sd1", modules), configs)
    config = model.noise_scheduler.config
    assert (config.beta_start, config.beta_end, config.prediction_type) == (
        0.00085, 0.012, "epsilon")


def test_ckpt_that_needs_more_than_tensors_is_refused(tiny, tmp_path):
    folder, modules = tiny["sd1"]
    path = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": ldm_state_dict(**modules), "callbacks": TrainingCallback()},
               str(path))
    with pytest.raises(ModelLoadError) as info:
        load(path, folder)
    message = str(info.value)
    assert "TrainingCallback" in message and "weights_only=True" in message
    assert "could run any code" in message and ".safetensors" in message


def test_model_version_that_disagrees_with_the_file_is_an_error(tiny, tmp_path):
    folder, modules = tiny["sd2"]
    path = write(tmp_path / "v2.safetensors", "sd2", modules)
    with pytest.raises(ModelLoadError, match=r"model_version = 'sd1'.*the file is SD 2\.x"):
        load(path, folder, model_version="sd1")
    assert load(path, folder, model_version="sd2").version == "sd2"


def test_prediction_type_setting_and_file_metadata(tiny, tmp_path):
    folder, modules = tiny["sd2"]  # its scheduler config says v_prediction
    path = write(tmp_path / "eps.safetensors", "sd2", modules,
                 metadata={"modelspec.prediction_type": "epsilon"})
    model = load(path, folder)
    assert model.prediction_type == "epsilon"
    assert model.noise_scheduler.config.prediction_type == "epsilon"
    assert "prediction type: modelspec.prediction_type in the file" in model.description
    model = load(path, folder, prediction_type="v_prediction")
    assert model.prediction_type == "v_prediction"


def test_cache_as_diffusers_writes_only_when_on(tiny, tmp_path, studio_home, monkeypatch):
    folder, modules = tiny["sdxl"]
    path = write(tmp_path / "xl.safetensors", "sdxl", modules)
    cache = studio_home / "single-file-cache"  # the session's: other files' tests use it too

    def cached():
        return set(cache.iterdir()) if cache.exists() else set()

    before, earlier = sorted(p.name for p in tmp_path.iterdir()), cached()
    load(path, folder)
    assert cached() == earlier and sorted(p.name for p in tmp_path.iterdir()) == before
    first = load(path, folder, cache_as_diffusers=True)
    (kept,) = cached() - earlier
    assert kept.name.startswith("xl-") and (kept / "model_index.json").is_file()
    assert json.loads((kept / "single_file.json").read_text())["version"] == "sdxl"
    monkeypatch.setattr(single_file, "Checkpoint", lambda *a: pytest.fail("file read again"))
    again = load(path, folder, cache_as_diffusers=True)
    assert_same_weights(again, modules)
    assert again.description.startswith(first.description) and "diffusers copy" in \
        again.description
    assert again.source == str(path) and again.tokenizer_2.pad_token == "!"
    with pytest.raises(ModelLoadError, match=r"model_version = 'sd2', but the file is SDXL"):
        load(path, folder, cache_as_diffusers=True, model_version="sd2")


@pytest.mark.parametrize("keys, message", [
    ({"lora_unet_down_blocks_0.lora_down.weight": (4, 4)}, "a LoRA"),
    ({"first_stage_model.encoder.conv_in.weight": (4, 3, 3, 3)}, "no UNet"),
    ({"model.diffusion_model.out.2.weight": (4, 4, 3, 3)}, "no text encoder"),
])
def test_files_that_are_not_base_models_are_named(tmp_path, keys, message):
    path = tmp_path / "odd.safetensors"
    save_file({k: torch.zeros(s) for k, s in keys.items()}, str(path))
    with pytest.raises(ModelLoadError, match=message) as info:
        load_base_model(ModelSection(pretrained_model_name_or_path=str(path)))
    assert str(info.value).startswith("model.pretrained_model_name_or_path = ")
