"""FLUX.1 and SD 3.x written in their original layouts are read back by diffusers' own reader.

The writer (trainer/families/common/mmdit_checkpoint.py) is held to diffusers' ``from_single_file``,
not to our loader: the transformer that diffusers builds from the written file gives the original
tiny model's outputs on fixed inputs. The published sizes are checked without memory on the meta
device: our writer's header for each shipped config is what diffusers' detection
(``infer_diffusers_model_type``) and ours call that model, and the shipped configs build the
published parameter counts.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from flow_helpers import scale_diffusers_flux_split
from safetensors import safe_open

from trainer.families.common.mmdit_checkpoint import (
    flow_state_dict,
    save_flow_checkpoint,
    swap_halves,
)
from trainer.families.common.mmdit_detect import detect_flow, detect_flow_file
from trainer.families.common.tiny_mmdit import build_flux_components, build_sd3_components

pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def flux_dev():
    return build_flux_components()


@pytest.fixture(scope="module")
def flux_schnell():
    return build_flux_components(guidance_embeds=False)


@pytest.fixture(scope="module")
def sd3():
    return build_sd3_components()


def config_folder(tmp_path, transformer):
    folder = tmp_path / "configs"
    (folder / "transformer").mkdir(parents=True)
    config = {k: v for k, v in dict(transformer.config).items() if not k.startswith("_")}
    config["_class_name"] = type(transformer).__name__
    (folder / "transformer" / "config.json").write_text(json.dumps(config))
    return folder


@torch.no_grad()
def flux_output(transformer):
    g = torch.Generator().manual_seed(0)
    config = transformer.config
    seq, txt = 16, 7
    kwargs = dict(
        hidden_states=torch.randn(1, seq, config.in_channels, generator=g),
        encoder_hidden_states=torch.randn(1, txt, config.joint_attention_dim, generator=g),
        pooled_projections=torch.randn(1, config.pooled_projection_dim, generator=g),
        timestep=torch.tensor([0.4]), img_ids=torch.randn(seq, 3, generator=g),
        txt_ids=torch.zeros(txt, 3), return_dict=False)
    if config.guidance_embeds:
        kwargs["guidance"] = torch.tensor([3.5])
    return transformer(**kwargs)[0]


@torch.no_grad()
def sd3_output(transformer):
    g = torch.Generator().manual_seed(0)
    config = transformer.config
    return transformer(
        hidden_states=torch.randn(1, config.in_channels, 8, 8, generator=g),
        encoder_hidden_states=torch.randn(1, 9, config.joint_attention_dim, generator=g),
        pooled_projections=torch.randn(1, config.pooled_projection_dim, generator=g),
        timestep=torch.tensor([400.0]), return_dict=False)[0]


def assert_same(actual, expected):
    """Equal weights give equal outputs up to the order of float sums (the loaded weights are
    views of the fused tensors, with other strides): 1e-5, the issue's bound."""
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture
def diffusers_flux_width(monkeypatch):
    scale_diffusers_flux_split(monkeypatch)


@pytest.mark.parametrize("variant", ["dev", "schnell"])
def test_flux_file_is_read_back_by_diffusers(tmp_path, variant, flux_dev, flux_schnell,
                                             diffusers_flux_width):
    from diffusers import FluxTransformer2DModel

    components = flux_dev if variant == "dev" else flux_schnell
    path = save_flow_checkpoint(tmp_path / "flux.safetensors", components, f"flux1-{variant}",
                                dtype=None)
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
        assert f.metadata()["modelspec.architecture"] == f"flux-1-{variant}"
    assert "double_blocks.0.img_attn.qkv.weight" in keys  # BFL's file: bare keys
    assert ("guidance_in.in_layer.weight" in keys) == (variant == "dev")
    loaded = FluxTransformer2DModel.from_single_file(
        str(path), config=str(config_folder(tmp_path, components["transformer"])),
        subfolder="transformer", local_files_only=True)
    assert_same(flux_output(loaded), flux_output(components["transformer"]))


def test_sd3_file_is_read_back_by_diffusers(tmp_path, sd3):
    from diffusers import SD3Transformer2DModel

    path = save_flow_checkpoint(tmp_path / "sd3.safetensors", sd3, "sd35-medium", dtype=None)
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
    assert "model.diffusion_model.joint_blocks.0.x_block.attn2.qkv.weight" in keys
    assert any(k.startswith("first_stage_model.decoder.") for k in keys)  # as SAI ships it
    loaded = SD3Transformer2DModel.from_single_file(
        str(path), config=str(config_folder(tmp_path, sd3["transformer"])),
        subfolder="transformer", local_files_only=True)
    assert_same(sd3_output(loaded), sd3_output(sd3["transformer"]))


def test_modulations_are_swapped_where_the_original_differs(sd3, flux_dev):
    """The final layer's (and SD 3's last pre-only context block's) modulation rows are (shift,
    scale) in the original and (scale, shift) in diffusers; the other blocks' are not swapped."""
    out = flow_state_dict(sd3, "sd35-medium")
    model = sd3["transformer"].state_dict()
    pre = "model.diffusion_model."
    assert torch.equal(out[pre + "final_layer.adaLN_modulation.1.weight"],
                       swap_halves(model["norm_out.linear.weight"]))
    assert torch.equal(out[pre + "joint_blocks.1.context_block.adaLN_modulation.1.bias"],
                       swap_halves(model["transformer_blocks.1.norm1_context.linear.bias"]))
    assert torch.equal(out[pre + "joint_blocks.0.context_block.adaLN_modulation.1.bias"],
                       model["transformer_blocks.0.norm1_context.linear.bias"])
    flux = flow_state_dict(flux_dev, "flux1-dev")
    assert torch.equal(flux["final_layer.adaLN_modulation.1.bias"],
                       swap_halves(flux_dev["transformer"].state_dict()["norm_out.linear.bias"]))


def test_combined_files_use_comfyui_prefixes(tmp_path, flux_dev, sd3):
    flux = save_flow_checkpoint(tmp_path / "aio.safetensors", flux_dev, "flux1-dev",
                                parts=["transformer", "vae", "clip_l", "t5xxl"])
    info = detect_flow_file(flux)
    assert info.prefixes == {"transformer": "model.diffusion_model.", "vae": "vae.",
                             "clip_l": "text_encoders.clip_l.transformer.",
                             "t5xxl": "text_encoders.t5xxl.transformer."}
    full = save_flow_checkpoint(tmp_path / "sd3.safetensors", sd3, "sd35-medium",
                                parts=["transformer", "vae", "clip_l", "clip_g", "t5xxl"])
    assert detect_flow_file(full).parts_inside == {"transformer", "vae", "clip_l", "clip_g",
                                                   "t5xxl"}
    with safe_open(str(full), "pt") as f:
        keys = set(f.keys())
    assert "text_encoders.clip_g.transformer.text_projection.weight" in keys
    assert "text_encoders.clip_l.transformer.text_projection.weight" not in keys
    with pytest.raises(ValueError, match="clip_g"):
        flow_state_dict(flux_dev, "flux1-dev", parts=["transformer", "clip_g"])


@functools.cache
def _published(family):
    """A meta-device model of a shipped transformer config (buffers too: no memory, no time)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    from trainer.families.spec import ASSETS

    cls = FluxTransformer2DModel if family.startswith("flux") else SD3Transformer2DModel
    with torch.device("meta"):
        return cls.from_config(cls.load_config(str(ASSETS / family), subfolder="transformer"))


@pytest.mark.parametrize("family,diffusers_type,label", [
    ("flux1-dev", "flux-dev", "FLUX.1-dev, guidance-distilled"),
    ("flux1-schnell", "flux-schnell", "FLUX.1-schnell"),
    ("sd35-large", "sd35_large", "SD 3.5 large"),
    ("sd35-medium", "sd35_medium", "SD 3.5 medium"),
    ("sd3-medium", "sd3", "SD 3 medium"),
])
def test_published_layouts_are_named_alike_by_diffusers_and_us(family, diffusers_type, label):
    from diffusers.loaders.single_file_utils import infer_diffusers_model_type

    tensors = flow_state_dict({"transformer": _published(family)}, family, ["transformer"])
    assert infer_diffusers_model_type(tensors) == diffusers_type
    info = detect_flow(tensors, lambda k: tuple(tensors[k].shape), lambda k: "BF16")
    assert info.family == family and info.published_size
    assert info.description.startswith(label + " (BF16 weights")


def test_shipped_configs_build_the_published_parameter_counts():
    """FLUX.1 11.9B (dev; schnell lacks the guidance embedder), SD 3.5 large 8.06B / medium
    2.24B, SD 3 medium 2.03B, the 16-channel VAE 83.8M, CLIP-L 123.1M, CLIP-G 694.7M, T5-XXL's
    encoder 4.76B (its token embedding shared)."""
    from diffusers import AutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from trainer.families.spec import ASSETS

    def count(model):
        return sum(p.numel() for p in model.parameters())

    expected = {"flux1-dev": 11_901_408_320, "flux1-schnell": 11_891_178_560,
                "sd35-large": 8_056_627_520, "sd35-medium": 2_243_171_520,
                "sd3-medium": 2_028_328_000}
    assert {f: count(_published(f)) for f in expected} == expected
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(str(ASSETS / "flux1-dev"),
                                                                  subfolder="vae"))
        clip_g = CLIPTextModelWithProjection(CLIPTextConfig.from_pretrained(
            str(ASSETS / "sd35-large" / "text_encoder_2")))
        t5 = T5EncoderModel(T5Config.from_pretrained(str(ASSETS / "flux1-dev" /
                                                         "text_encoder_2")))
    t5.encoder.set_input_embeddings(t5.shared)
    assert (count(vae), count(clip_g), count(t5)) == (83_819_683, 694_659_840, 4_762_310_656)
