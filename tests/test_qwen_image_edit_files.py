"""Qwen-Image-Edit and -Edit-2509 from the split files as ComfyUI users download them
(``qwen_image_edit_bf16.safetensors``, ``qwen_image_edit_2509_bf16.safetensors``), which have
Qwen-Image's keys: ``model.model_version`` names the variant (as ``flux1_kontext`` names a
FLUX.1 Kontext file), the log says which, the edit model's conditioning is its folder's, the
Qwen2.5-VL image processor is looked up as the tokenizer is, and a variant asked of a file
that is not one gets a clear refusal. The files are written from the tiny twin."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_qwen_image_edit import TWIN, pixels, plus_model

from trainer.config import ModelSection, TrainConfig
from trainer.families import ModelLoadError, detect_path, family, label
from trainer.families.common import qwen_processor
from trainer.families.qwen_image.checkpoint import (
    save_checkpoint,
    text_encoder_tensors,
    vae_tensors,
)
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
DIT = "qwen_image_edit_bf16.safetensors"


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The edit twin as three ComfyUI files, and a folder of its configs alone (no
    processor, no tokenizer), as ``model.config_dir`` for the tiny shapes."""
    root = tmp_path_factory.mktemp("qwen_edit_split")
    twin = load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))
    save_checkpoint(root / DIT, {"transformer": twin.denoiser}, dtype=None)
    save_file(vae_tensors(twin.vae), root / "qwen_image_vae.safetensors")
    save_file({k: v.contiguous() for k, v in text_encoder_tensors(twin.text_encoder).items()},
              root / "qwen_2.5_vl_7b.safetensors")
    folder = resolve_model_path(TWIN)
    configs = root / "configs"
    for part in ("transformer", "vae", "text_encoder"):
        (configs / part).mkdir(parents=True)
        shutil.copy(folder / part / "config.json", configs / part / "config.json")
    return root, twin


def section(root, **more) -> ModelSection:
    folder = str(resolve_model_path(TWIN))
    values = dict(pretrained_model_name_or_path=str(root / DIT),
                  vae=str(root / "qwen_image_vae.safetensors"),
                  text_encoder=str(root / "qwen_2.5_vl_7b.safetensors"),
                  config_dir=folder, tokenizer=folder)
    return ModelSection(**{**values, **more})


def test_the_setting_names_the_edit_variant_of_a_qwen_image_keyed_file(split):
    root, twin = split
    assert detect_path(root / DIT).family == "qwen_image"  # the keys are Qwen-Image's
    plain = load_base_model(section(root))
    assert plain.variant == "base" and plain.processor is None
    model = load_base_model(section(root, model_version="qwen_image_edit"))
    assert model.version == "qwen_image" and model.variant == "edit"
    assert model.description.startswith("Qwen-Image-Edit, by model.model_version (Qwen-Image")
    control = pixels(3, 1, 64, 64)
    with torch.no_grad():
        ours = family("qwen_image").encode(model, ["make it blue"], 0, controls=[control])
        folder = family("qwen_image").encode(twin, ["make it blue"], 0, controls=[control])
    torch.testing.assert_close(ours.hidden, folder.hidden, rtol=0, atol=0)


def test_2509_is_the_plus_pipelines_conditioning(split, tmp_path_factory):
    root, _ = split
    model = load_base_model(section(root, model_version="qwen_image_edit_2509"))
    assert model.variant == "edit-2509" and not model.denoiser.config.zero_cond_t
    assert model.description.startswith("Qwen-Image-Edit-2509, by model.model_version")
    plus = plus_model(tmp_path_factory)  # the twin's folder as QwenImageEditPlusPipeline
    controls = [pixels(4, 1, 64, 96), pixels(5, 1, 64, 64)]
    with torch.no_grad():
        ours = family("qwen_image").encode(model, ["swap them"], 0, controls=controls)
        theirs = family("qwen_image").encode(plus, ["swap them"], 0, controls=controls)
    torch.testing.assert_close(ours.hidden, theirs.hidden, rtol=0, atol=0)


def test_the_config_reads_a_variants_name_as_its_family():
    from trainer.config.rules.family import known_family

    cfg = TrainConfig(model={"model_version": "qwen_image_edit_2509",
                             "text_encoder": "qwen_2.5_vl_7b.safetensors"})
    assert known_family(cfg) == "qwen_image"  # Qwen-Image's settings are read
    assert label("qwen_image_edit_2509") == "Qwen-Image-Edit-2509"
    with pytest.raises(ValueError, match="model.model_version"):
        TrainConfig(model={"model_version": "qwen_image_edit_2510"})


def test_a_split_edit_run_trains_on_pairs(split, tmp_path):
    from control_helpers import pairs
    from train_helpers import small_config

    from trainer.events import ListSink, Log
    from trainer.run.loop import run

    root, _ = split
    train = pairs(tmp_path / "data", names=("a",), sizes=((64, 64),))
    model = section(root, model_version="qwen_image_edit").model_dump()
    cfg = small_config(tmp_path, train, model=model, dataset={"control_dir": "control"},
                       training={"max_train_steps": 1, "mixed_precision": "no"})
    kind, seen = type(family("qwen_image")), []
    real = kind.predict

    def predict(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        seen.append((model.variant, len(controls or ())))
        return real(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    sink = ListSink()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kind, "predict", predict)
        result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert seen == [("edit", 1)]
    assert any("(Qwen-Image-Edit, by model.model_version" in e.message for e in sink.of(Log))
    from safetensors import safe_open

    with safe_open(result.output_path, "pt") as f:  # musubi-tuner's architecture of Edit
        assert f.metadata()["modelspec.architecture"] == "qwen-image-edit/lora"


def test_the_processor_is_found_beside_the_file(split, tmp_path, empty_hf_cache):
    """No settings: the tokenizer and the processor beside the file, as the tokenizer
    look-up finds it (a processor of its own values, to tell it from the shipped one)."""
    root, _ = split
    for name in (DIT, "qwen_image_vae.safetensors", "qwen_2.5_vl_7b.safetensors"):
        (tmp_path / name).symlink_to(root / name)
    shutil.copytree(resolve_model_path(TWIN) / "tokenizer", tmp_path / "tokenizer")
    config = json.loads((qwen_processor.SHIPPED / qwen_processor.CONFIG).read_text())
    (tmp_path / "processor").mkdir()
    (tmp_path / "processor" / qwen_processor.CONFIG).write_text(
        json.dumps(dict(config, max_pixels=40000)))
    model = load_base_model(section(tmp_path, model_version="qwen_image_edit", tokenizer=None,
                                    config_dir=str(root / "configs")))
    assert model.processor.image_processor.size.longest_edge == 40000
    found = qwen_processor.locate(None, str(root / "configs"), [tmp_path / DIT])
    assert found.folder == tmp_path / "processor" and found.where.startswith("beside the file")


def test_the_processor_lookup_order(split, tmp_path, empty_hf_cache):
    """model.tokenizer's folder (a diffusers edit folder: its processor/), then the Hugging
    Face cache, else the shipped copy, whose note gives the `hf download` command."""
    root, _ = split
    folder = resolve_model_path(TWIN)
    assert qwen_processor.locate(str(folder), None, [root / DIT]).where == "model.tokenizer"
    found = qwen_processor.locate(None, None, [root / DIT])
    assert found.folder == qwen_processor.SHIPPED
    assert 'hf download Qwen/Qwen-Image-Edit --include "processor/*"' in found.where
    assert dict(qwen_processor.cache_report())[qwen_processor.LABEL].endswith(
        qwen_processor.FETCH)
    cached = empty_hf_cache / "models--Qwen--Qwen-Image-Edit-2509"
    (cached / "refs").mkdir(parents=True)
    (cached / "refs" / "main").write_text("0" * 40)
    snapshot = cached / "snapshots" / ("0" * 40) / "processor"
    snapshot.mkdir(parents=True)
    shutil.copy(qwen_processor.SHIPPED / qwen_processor.CONFIG, snapshot)
    found = qwen_processor.locate(None, None, [root / DIT])
    assert found.folder == snapshot
    assert found.where == "Hugging Face cache (Qwen/Qwen-Image-Edit-2509/processor)"
    from trainer.tools import doctor

    report = doctor.build_report()
    assert (qwen_processor.LABEL, "ready, processor from the Hugging Face cache "
            "(Qwen/Qwen-Image-Edit-2509/processor)") in report.models


def test_the_doctor_says_how_to_name_an_edit_file(split, empty_hf_cache):
    from trainer.tools.model_report import model_lines

    root, _ = split
    text = "\n".join(model_lines(str(root / DIT)))
    assert "set model.model_version to 'qwen_image_edit' or 'qwen_image_edit_2509'" in text
    assert "image processor: not in the Hugging Face cache" in text


@pytest.mark.parametrize("marker, version, refusal", [
    (False, "qwen_image_edit_2511", "carries ComfyUI's __index_timestep_zero__ key, and this "
                                    "one has none"),
    (True, "qwen_image_edit_2509", "but the file is Qwen-Image-Edit-2511"),
])
def test_a_variant_the_file_plainly_is_not_is_refused(split, tmp_path, marker, version,
                                                      refusal):
    root, _ = split
    path = root / DIT
    if marker:
        tensors = load_file(path)
        tensors["__index_timestep_zero__"] = torch.tensor([])
        path = tmp_path / "qwen_image_edit_2511_bf16.safetensors"
        save_file(tensors, path)
    with pytest.raises(ModelLoadError, match=f"model.model_version = '{version}'.*{refusal}"):
        load_base_model(section(root, model_version=version,
                                pretrained_model_name_or_path=str(path)))


def test_an_edit_variant_asked_of_another_model_is_refused(tmp_path):
    """A FLUX.1 file, and a Qwen-Image (text-to-image) folder, named as Qwen-Image-Edit."""
    from test_flow_train import single_file_model

    flux = single_file_model(tmp_path, "flux1")
    with pytest.raises(ModelLoadError, match="model.model_version = 'qwen_image_edit', but "
                                             "the file is FLUX.1"):
        load_base_model(ModelSection(**{**flux, "model_version": "qwen_image_edit"}))
    with pytest.raises(ModelLoadError, match=r"model.model_version = 'qwen_image_edit' "
                                             r"\(Qwen-Image-Edit\), but the folder holds a "
                                             r"Qwen-Image pipeline"):
        load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-qwen-image",
                                     model_version="qwen_image_edit"))
