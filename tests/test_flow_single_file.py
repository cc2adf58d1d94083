"""FLUX.1 and SD 3.x single files load offline into the pipelines' components.

The files are the tiny models written by trainer/families/common/mmdit_checkpoint.py (itself held to
diffusers' reader in test_export_flow_checkpoint.py); loaded back with
trainer/families/common/mmdit_single_file.py, every module equals the original and the transformer
gives its outputs. The tiny models are not the published size, so their configs come from a folder
of configs (``model.config_dir``) or, for the SD 3.x transformer, from the file's header.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import save_file

from trainer.families.common.mmdit_checkpoint import (
    clip_tensors,
    flow_state_dict,
    save_flow_checkpoint,
    t5_tensors,
    vae_tensors,
)
from trainer.families.common.mmdit_detect import detect_flow_file
from trainer.families.common.mmdit_single_file import load_flow_components
from trainer.families.common.mmdit_tokenizers import (
    T5_FETCH,
    TokenizerNotFound,
    load_flow_tokenizers,
)
from trainer.families.common.tiny_mmdit import build_flux_components, save_tiny_flow_model
from trainer.families.spec import DetectionError, ModelLoadError

pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> (diffusers folder, its components, a folder of its configs without weights)."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    root = tmp_path_factory.mktemp("flow_files")
    out = {}
    for family, cls in (("flux", FluxPipeline), ("sd3", StableDiffusion3Pipeline)):
        folder = save_tiny_flow_model(root / family, family=family)
        configs = root / f"{family}-configs"
        shutil.copytree(folder, configs, ignore=shutil.ignore_patterns("*.safetensors",
                                                                        "tokenizer*"))
        out[family] = (folder, cls.from_pretrained(folder, local_files_only=True).components,
                       configs)
    return out


def same_modules(loaded, original, names):
    for name in names:
        a, b = original[name].state_dict(), loaded[name].state_dict()
        assert a.keys() == b.keys(), name
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=f"{name}.{key}")


@torch.no_grad()
def flux_output(transformer):
    g = torch.Generator().manual_seed(0)
    c = transformer.config
    kwargs = dict(hidden_states=torch.randn(1, 16, c.in_channels, generator=g),
                  encoder_hidden_states=torch.randn(1, 5, c.joint_attention_dim, generator=g),
                  pooled_projections=torch.randn(1, c.pooled_projection_dim, generator=g),
                  timestep=torch.tensor([0.3]), img_ids=torch.randn(16, 3, generator=g),
                  txt_ids=torch.zeros(5, 3), return_dict=False)
    if c.guidance_embeds:
        kwargs["guidance"] = torch.tensor([1.0])
    return transformer(**kwargs)[0]


@torch.no_grad()
def sd3_output(transformer):
    g = torch.Generator().manual_seed(0)
    c = transformer.config
    return transformer(hidden_states=torch.randn(1, c.in_channels, 8, 8, generator=g),
                       encoder_hidden_states=torch.randn(1, 6, c.joint_attention_dim, generator=g),
                       pooled_projections=torch.randn(1, c.pooled_projection_dim, generator=g),
                       timestep=torch.tensor([300.0]), return_dict=False)[0]


def test_flux_all_in_one_file_loads_every_component(tmp_path, tiny):
    folder, original, configs = tiny["flux"]
    path = save_flow_checkpoint(tmp_path / "flux-aio.safetensors", original, "flux1-dev",
                                parts=["transformer", "vae", "clip_l", "t5xxl"], dtype=None)
    info = detect_flow_file(path)
    assert info.family == "flux1-dev" and info.version == "flux1" and info.variant == "dev"
    assert info.description.startswith("FLUX.1-dev, guidance-distilled (F32 weights")
    loaded = load_flow_components(path, config_dir=str(configs), tokenizer=str(folder))
    assert set(loaded) == {"transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer",
                           "tokenizer_2", "scheduler"}
    same_modules(loaded, original, ["transformer", "vae", "text_encoder", "text_encoder_2"])
    torch.testing.assert_close(flux_output(loaded["transformer"]),
                               flux_output(original["transformer"]), rtol=1e-5, atol=1e-5)
    assert loaded["tokenizer_2"].model_max_length == 512  # dev's T5 length
    assert type(loaded["scheduler"]).__name__ == "FlowMatchEulerDiscreteScheduler"


def test_flux_schnell_transformer_with_separate_part_files(tmp_path, tiny):
    """BFL's bare transformer file, ae.safetensors (bare LDM names), clip_l and t5xxl files in
    transformers' names (as comfyanonymous/flux_text_encoders ships them)."""
    folder, _, dev_configs = tiny["flux"]
    original = build_flux_components(guidance_embeds=False)
    configs = tmp_path / "configs"
    shutil.copytree(dev_configs, configs)
    original["transformer"].save_config(configs / "transformer")
    path = save_flow_checkpoint(tmp_path / "flux1-schnell.safetensors", original,
                                "flux1-schnell", dtype=None)
    files = {"ae": vae_tensors(original["vae"]), "clip_l": clip_tensors(original["text_encoder"]),
             "t5xxl": t5_tensors(original["text_encoder_2"])}
    for name, tensors in files.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / f"{name}.st"))
    assert "encoder.conv_in.weight" in files["ae"] and "shared.weight" in files["t5xxl"]
    info = detect_flow_file(path)
    assert (info.family, info.parts_inside) == ("flux1-schnell", {"transformer"})
    assert info.description.startswith("FLUX.1-schnell (")
    loaded = load_flow_components(path, ae=str(tmp_path / "ae.st"),
                                  clip_l=str(tmp_path / "clip_l.st"),
                                  t5xxl=str(tmp_path / "t5xxl.st"), config_dir=str(configs),
                                  tokenizer=str(folder))
    same_modules(loaded, original, ["transformer", "vae", "text_encoder", "text_encoder_2"])
    torch.testing.assert_close(flux_output(loaded["transformer"]),
                               flux_output(original["transformer"]), rtol=1e-5, atol=1e-5)
    assert loaded["tokenizer_2"].model_max_length == 256  # schnell's T5 length


def test_sd3_transformer_shapes_come_from_the_header(tmp_path, tiny):
    folder, original, configs = tiny["sd3"]
    shutil.rmtree(configs / "transformer", ignore_errors=True)  # no config: the header's shapes
    path = save_flow_checkpoint(tmp_path / "sd35m.safetensors", original, "sd35-medium",
                                parts=["transformer", "vae", "clip_l", "clip_g", "t5xxl"],
                                dtype=None)
    info = detect_flow_file(path)
    assert info.family == "sd35-medium" and not info.published_size
    assert info.transformer_config["dual_attention_layers"] == [0]
    loaded = load_flow_components(path, config_dir=str(configs), tokenizer=str(folder))
    same_modules(loaded, original, ["transformer", "vae", "text_encoder_2", "text_encoder_3"])
    torch.testing.assert_close(sd3_output(loaded["transformer"]),
                               sd3_output(original["transformer"]), rtol=1e-5, atol=1e-5)
    # SD 3's CLIP-L pools without projection: diffusers' reader and ours give it an identity
    assert torch.equal(loaded["text_encoder"].text_projection.weight, torch.eye(32))
    assert {"tokenizer", "tokenizer_2", "tokenizer_3", "text_encoder_3"} <= set(loaded)


def test_fp8_weights_are_upcast_on_load(tmp_path, tiny):
    folder, original, configs = tiny["flux"]
    path = save_flow_checkpoint(tmp_path / "flux-fp8.safetensors", original, "flux1-dev",
                                parts=["transformer", "vae", "clip_l", "t5xxl"],
                                dtype=torch.float8_e4m3fn)
    assert detect_flow_file(path).dtype == "F8_E4M3"
    loaded = load_flow_components(path, config_dir=str(configs), tokenizer=str(folder))
    transformer = loaded["transformer"]
    assert next(transformer.parameters()).dtype == torch.float32
    expected = flow_state_dict(original, "flux1-dev")
    rounded = {k: v.to(torch.float8_e4m3fn).float() for k, v in expected.items()}
    again = flow_state_dict({"transformer": transformer}, "flux1-dev")
    assert again.keys() == rounded.keys()
    for key in rounded:
        assert torch.equal(again[key], rounded[key]), key


def test_a_missing_part_names_every_setting_to_set(tmp_path, tiny):
    _, original, configs = tiny["flux"]
    path = save_flow_checkpoint(tmp_path / "flux1-dev.safetensors", original, "flux1-dev")
    with pytest.raises(ModelLoadError) as err:
        load_flow_components(path, config_dir=str(configs))
    message = str(err.value)
    for setting in ("model.ae", "model.clip_l", "model.t5xxl"):
        assert setting in message
    assert "ae.safetensors" in message and "FLUX.1-dev" in message
    with pytest.raises(ModelLoadError, match="model.ae = .*no VAE decoder"):
        load_flow_components(path, ae=str(path), clip_l=str(path), t5xxl=str(path),
                             config_dir=str(configs), tokenizer=str(tiny["flux"][0]))
    dev = tmp_path / "dev-configs"
    shutil.copytree(configs, dev)
    schnell = build_flux_components(guidance_embeds=False)["transformer"]
    schnell.save_config(dev / "transformer")  # a config that does not fit the dev file
    with pytest.raises(ModelLoadError, match="model.config_dir .*guidance_embeds"):
        load_flow_components(path, ae=str(path), clip_l=str(path), t5xxl=str(path),
                             config_dir=str(dev), tokenizer=str(tiny["flux"][0]))


def test_unknown_layouts_and_lora_files_are_named(tmp_path, tiny):
    _, original, _ = tiny["flux"]
    vae_only = tmp_path / "vae.safetensors"
    save_file({k: v.contiguous() for k, v in vae_tensors(original["vae"]).items()}, str(vae_only))
    with pytest.raises(DetectionError, match="no FLUX.1 transformer"):
        detect_flow_file(vae_only)
    lora = tmp_path / "lora.safetensors"
    save_file({"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.zeros(4, 32),
               "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": torch.zeros(96, 4),
               "lora_unet_double_blocks_0_img_attn_qkv.alpha": torch.tensor(4.0)}, str(lora))
    with pytest.raises(ModelLoadError, match="model.pretrained_model_name_or_path = .*a LoRA"):
        load_flow_components(lora)


def test_flux_of_another_head_width_needs_its_config(tmp_path, tiny):
    folder, original, configs = tiny["flux"]
    path = save_flow_checkpoint(tmp_path / "flux.safetensors", original, "flux1-dev",
                                parts=["transformer", "vae", "clip_l", "t5xxl"])
    bare = tmp_path / "configs"
    shutil.copytree(configs, bare, ignore=shutil.ignore_patterns("transformer"))
    with pytest.raises(ModelLoadError, match="heads 16 wide .*model.config_dir"):
        load_flow_components(path, config_dir=str(bare), tokenizer=str(folder))


def test_t5_tokenizer_lookup_and_its_hint(tmp_path, tiny, monkeypatch):
    import huggingface_hub.constants

    folder, _, _ = tiny["flux"]
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    model = tmp_path / "models" / "flux.safetensors"
    model.parent.mkdir()
    with pytest.raises(TokenizerNotFound) as err:
        load_flow_tokenizers("flux1-dev", None, model)
    assert T5_FETCH in str(err.value) or "clip" in str(err.value).lower()
    for slot in ("tokenizer", "tokenizer_2"):  # beside the file, as a diffusers folder has them
        shutil.copytree(folder / slot, model.parent / slot)
    found = load_flow_tokenizers("flux1-schnell", None, model)
    assert type(found["tokenizer_2"]).__name__.startswith("T5")
    shutil.rmtree(model.parent / "tokenizer_2")
    with pytest.raises(TokenizerNotFound) as err:
        load_flow_tokenizers("flux1-dev", None, model)
    assert T5_FETCH in str(err.value) and "tokenizer_2" in str(err.value)
    with pytest.raises(TokenizerNotFound, match="model.tokenizer = .*T5"):
        load_flow_tokenizers("flux1-dev", str(folder / "tokenizer"), model)


@pytest.mark.parametrize("base", ["fp8", "nf4"])
def test_the_diffusers_copy_holds_the_files_weights_not_the_stored_ones(tmp_path, base):
    """model.cache_as_diffusers with a memory option: the copy is written as the file loads
    (bf16 here), never from fp8 or NF4 storage, so that a later run without the option reads
    the file's own values; the run's memory options apply after the load."""
    import json

    from test_flow_train import single_file_model

    from trainer.config import ModelSection
    from trainer.families.common.files import read_safetensors_header
    from trainer.models.loader import _cache_folder, load_base_model

    model = single_file_model(tmp_path, "flux1")
    section = ModelSection(**model, base_precision=base, fp8_text_encoders=True,
                           cache_as_diffusers=True)
    loaded = load_base_model(section, torch.bfloat16, t5_frozen=True)
    assert {p.dtype for p in loaded.unet.parameters()} == {torch.bfloat16}
    kept = _cache_folder(tmp_path / "flux1-dev.safetensors", section)
    dtypes = {entry["dtype"] for f in kept.rglob("*.safetensors")
              for entry in read_safetensors_header(f).tensors.values()}
    assert dtypes == {"BF16"}, dtypes
    assert json.loads((kept / "single_file.json").read_text())["version"] == "flux1"
