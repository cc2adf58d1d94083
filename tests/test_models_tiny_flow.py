"""The tiny FLUX.1 and SD 3.5: deterministic, offline, loadable by diffusers' own pipelines, with
the constraints that tie their parts together, and trainable with the flow objective."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import folder_digest as digest

from trainer.families.common.tiny_mmdit import (
    FLUX_ROPE_AXES,
    FLUX_VAE,
    FLUX_WIDTHS,
    LATENT_CHANNELS,
    SD3_VAE,
    SD3_WIDTHS,
    build_flux_components,
    build_sd3_components,
    build_t5_tokenizer,
    save_tiny_flow_model,
)
from trainer.objectives.flow import noisy_latents, sample_sigmas, velocity_target


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_flow")
    return {family: save_tiny_flow_model(root / family, family=family)
            for family in ("flux", "sd3")}


def load(folder, family):
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    cls = FluxPipeline if family == "flux" else StableDiffusion3Pipeline
    return cls.from_pretrained(folder, local_files_only=True)


def generate(pipe, seed=0):
    return pipe("a red circle", num_inference_steps=2, height=32, width=32, output_type="np",
                max_sequence_length=32, generator=torch.Generator().manual_seed(seed)).images


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_builds_identically_twice_and_small(tmp_path, folders, family):
    again = save_tiny_flow_model(tmp_path / family, family=family)
    assert digest(again) == digest(folders[family])
    assert sum(f.stat().st_size for f in again.rglob("*") if f.is_file()) < 10 * 2**20
    assert json.loads((again / "embedded.json").read_text())["builder"] == f"tiny-{family}"


def test_unknown_family_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tiny flow families"):
        save_tiny_flow_model(tmp_path / "x", family="sdxl")


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_the_pipeline_loads_offline_and_draws_the_same_image_twice(folders, family, no_network):
    pipe = load(folders[family], family)
    image = generate(pipe)
    assert image.shape == (1, 32, 32, 3) and image.min() >= 0 and image.max() <= 1
    assert (image == generate(load(folders[family], family))).all()
    assert not (image == generate(pipe, seed=1)).all()


def test_t5_tokenizer_keeps_t5s_ids_and_survives_the_folder(folders):
    tokenizer = build_t5_tokenizer(512)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    ids = tokenizer("a red circle").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["▁a", "▁red", "▁circle", "</s>"]
    unknown = tokenizer("zq").input_ids  # not a word of the list: spelled out by characters
    assert tokenizer.convert_ids_to_tokens(unknown) == ["▁z", "q", "</s>"]
    loaded = load(folders["flux"], "flux").tokenizer_2
    text = "photo of sks dog, high quality!"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.model_max_length == 512


def test_flux_parts_fit_together():
    parts = build_flux_components()
    t, vae = parts["transformer"].config, parts["vae"].config
    assert sum(t.axes_dims_rope) == t.attention_head_dim == sum(FLUX_ROPE_AXES)
    assert vae.latent_channels == LATENT_CHANNELS and t.in_channels == 4 * vae.latent_channels
    assert t.pooled_projection_dim == parts["text_encoder"].config.hidden_size
    assert t.joint_attention_dim == parts["text_encoder_2"].config.d_model == FLUX_WIDTHS["t5"]
    assert t.guidance_embeds  # FLUX.1-dev; schnell has none
    assert not build_flux_components(guidance_embeds=False)["transformer"].config.guidance_embeds
    assert (vae.scaling_factor, vae.shift_factor) == (FLUX_VAE["scaling_factor"],
                                                       FLUX_VAE["shift_factor"])
    assert not vae.use_quant_conv and not vae.use_post_quant_conv
    assert parts["scheduler"].config.use_dynamic_shifting


def test_sd3_parts_fit_together():
    parts = build_sd3_components()
    t, vae = parts["transformer"].config, parts["vae"].config
    clip_l, clip_g = parts["text_encoder"].config, parts["text_encoder_2"].config
    assert t.in_channels == vae.latent_channels == LATENT_CHANNELS
    assert t.pooled_projection_dim == clip_l.projection_dim + clip_g.projection_dim
    assert t.joint_attention_dim == parts["text_encoder_3"].config.d_model == SD3_WIDTHS["t5"]
    # the pipeline pads CLIP-L's and CLIP-G's hidden states side by side to T5's width
    assert clip_l.hidden_size + clip_g.hidden_size <= t.joint_attention_dim
    assert t.caption_projection_dim == t.num_attention_heads * t.attention_head_dim
    assert clip_l.hidden_size != clip_g.hidden_size
    assert (vae.scaling_factor, vae.shift_factor) == (SD3_VAE["scaling_factor"],
                                                       SD3_VAE["shift_factor"])
    # SD 3.5: RMS-normed q and k; 3.5 medium's second attention in the listed blocks only
    blocks = parts["transformer"].transformer_blocks
    assert t.qk_norm == "rms_norm" and type(blocks[0].attn.norm_q).__name__ == "RMSNorm"
    assert blocks[0].attn2 is not None and blocks[1].attn2 is None
    assert parts["tokenizer"].pad_token == "<|endoftext|>" and parts["tokenizer_2"].pad_token == "!"


def flow_loss(pred, latents, noise):
    return torch.nn.functional.mse_loss(pred, velocity_target(latents, noise))


def test_flux_transformer_trains_on_packed_latents_with_the_flow_objective():
    from diffusers import FluxPipeline

    parts = build_flux_components()
    model = parts["transformer"]
    torch.manual_seed(0)
    latents, noise = torch.randn(2, LATENT_CHANNELS, 8, 8), torch.randn(2, LATENT_CHANNELS, 8, 8)
    sigmas = sample_sigmas("flux_shift", 2, latent_size=(8, 8),
                           generator=torch.Generator().manual_seed(0))
    packed = FluxPipeline._pack_latents(noisy_latents(latents, noise, sigmas), 2,
                                        LATENT_CHANNELS, 8, 8)
    assert packed.shape == (2, 16, 4 * LATENT_CHANNELS)  # 4x4 patches of 2x2x16
    pred = model(hidden_states=packed, timestep=sigmas, guidance=torch.ones(2),
                 pooled_projections=torch.randn(2, FLUX_WIDTHS["clip_l"]),
                 encoder_hidden_states=torch.randn(2, 5, FLUX_WIDTHS["t5"]),
                 txt_ids=torch.zeros(5, 3),
                 img_ids=FluxPipeline._prepare_latent_image_ids(2, 4, 4, "cpu", torch.float32),
                 ).sample
    pred = FluxPipeline._unpack_latents(pred, 64, 64, 8)  # a 64 px image, VAE factor 8
    assert pred.shape == latents.shape
    flow_loss(pred, latents, noise).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_sd3_transformer_trains_with_the_flow_objective():
    parts = build_sd3_components()
    model = parts["transformer"]
    torch.manual_seed(0)
    latents, noise = torch.randn(2, LATENT_CHANNELS, 8, 8), torch.randn(2, LATENT_CHANNELS, 8, 8)
    sigmas = sample_sigmas("sigma", 2, weighting_scheme="logit_normal",
                           generator=torch.Generator().manual_seed(0))
    pred = model(hidden_states=noisy_latents(latents, noise, sigmas), timestep=sigmas * 1000,
                 encoder_hidden_states=torch.randn(2, 7, SD3_WIDTHS["t5"]),
                 pooled_projections=torch.randn(2, SD3_WIDTHS["clip_l"] + SD3_WIDTHS["clip_g"]),
                 ).sample
    assert pred.shape == latents.shape
    flow_loss(pred, latents, noise).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
