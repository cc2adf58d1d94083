"""The tiny SD 2.x and SDXL builders: deterministic, small, the family's features, fast to train."""

from __future__ import annotations

import json
import time

import pytest
import torch
from train_helpers import folder_digest as digest

from trainer.families.sd.tiny import (
    SDXL_TIME_EMBED_DIM,
    SDXL_WIDTHS,
    build_sd2_components,
    build_sdxl_components,
    save_tiny_model,
)


@pytest.mark.parametrize("family", ["sd2", "sdxl"])
def test_builds_identically_twice_and_small(tmp_path, family):
    a = save_tiny_model(tmp_path / "a", family=family)
    b = save_tiny_model(tmp_path / "b", family=family)
    assert digest(a) == digest(b)
    assert sum(f.stat().st_size for f in a.rglob("*") if f.is_file()) < 30 * 2**20
    assert json.loads((a / "embedded.json").read_text())["builder"] == f"tiny-{family}"


def test_unknown_family_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tiny families"):
        save_tiny_model(tmp_path / "x", family="sd3")


def test_sd2_has_the_features_of_sd2(tmp_path):
    from diffusers import StableDiffusionPipeline

    parts = build_sd2_components(prediction_type="epsilon")
    assert parts["unet"].config.use_linear_projection
    assert isinstance(parts["unet"].down_blocks[0].attentions[0].proj_in, torch.nn.Linear)
    assert parts["text_encoder"].config.hidden_act == "gelu"
    assert parts["tokenizer"].pad_token == "!"
    assert parts["scheduler"].config.prediction_type == "epsilon"
    folder = save_tiny_model(tmp_path / "v", family="sd2")
    pipe = StableDiffusionPipeline.from_pretrained(folder, local_files_only=True)
    assert pipe.scheduler.config.prediction_type == "v_prediction"
    assert json.loads((folder / "embedded.json").read_text())["prediction_type"] == \
        "v_prediction"
    image = pipe("a red circle", num_inference_steps=2, height=64, width=64,
                 output_type="np").images
    assert image.shape == (1, 64, 64, 3)


def test_sdxl_has_two_encoders_of_different_widths(tmp_path):
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    folder = save_tiny_model(tmp_path / "xl", family="sdxl")
    pipe = StableDiffusionXLPipeline.from_pretrained(folder, local_files_only=True)
    assert type(pipe.text_encoder) is CLIPTextModel
    assert isinstance(pipe.text_encoder_2, CLIPTextModelWithProjection)
    widths = (pipe.text_encoder.config.hidden_size, pipe.text_encoder_2.config.hidden_size)
    assert widths == SDXL_WIDTHS and widths[0] != widths[1]
    unet = pipe.unet.config
    assert unet.addition_embed_type == "text_time"
    assert unet.cross_attention_dim == sum(SDXL_WIDTHS)
    assert unet.projection_class_embeddings_input_dim == (
        pipe.text_encoder_2.config.projection_dim + 6 * SDXL_TIME_EMBED_DIM)
    assert pipe.tokenizer.pad_token == "<|endoftext|>" and pipe.tokenizer_2.pad_token == "!"
    image = pipe("a red circle", num_inference_steps=2, height=64, width=64,
                 output_type="np").images
    assert image.shape == (1, 64, 64, 3)


def sdxl_train_step(parts, optimizer, images):
    """One SDXL-style step: penultimate states of both encoders, pooled text, size ids."""
    tok = [parts[k](["a red circle"] * len(images), padding="max_length", max_length=77,
                    return_tensors="pt").input_ids for k in ("tokenizer", "tokenizer_2")]
    with torch.no_grad():
        vae = parts["vae"]
        latents = vae.encode(images).latent_dist.sample() * vae.config.scaling_factor
        first = parts["text_encoder"](tok[0], output_hidden_states=True)
        second = parts["text_encoder_2"](tok[1], output_hidden_states=True)
    context = torch.cat([first.hidden_states[-2], second.hidden_states[-2]], dim=-1)
    size_ids = torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * len(images))
    noise = torch.randn_like(latents)
    t = torch.randint(0, 1000, (len(images),))
    pred = parts["unet"](latents + noise, t, context, added_cond_kwargs={
        "text_embeds": second.text_embeds, "time_ids": size_ids}).sample
    loss = torch.nn.functional.mse_loss(pred, noise)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def test_sdxl_trains_at_64px_well_under_a_second_a_step():
    torch.manual_seed(0)
    parts = build_sdxl_components()
    optimizer = torch.optim.AdamW(parts["unet"].parameters(), lr=1e-4)
    images = torch.rand(2, 3, 64, 64) * 2 - 1
    sdxl_train_step(parts, optimizer, images)  # warm-up
    start = time.perf_counter()
    losses = [sdxl_train_step(parts, optimizer, images) for _ in range(3)]
    assert (time.perf_counter() - start) / 3 < 1.0
    assert all(torch.isfinite(loss) for loss in losses)
