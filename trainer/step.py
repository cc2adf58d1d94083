"""One training step's forward pass: from a batch to the loss. Shared by every method."""

from __future__ import annotations

import re
from typing import Any

import torch
from diffusers.training_utils import compute_snr

from trainer.config import TrainConfig
from trainer.losses import diffusion_loss, min_snr_weights, offset_noise, target_for
from trainer.models.conditioning import TextConditioning, family_of


def encode_images(vae, pixels: torch.Tensor) -> torch.Tensor:
    """Pixels in [-1, 1] -> scaled latents (the distribution's mode, so caching is exact)."""
    latents = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
    return latents * vae.config.scaling_factor


def expand_multi_vector_tokens(prompt: str, tokenizer: Any) -> str:
    """``<tok>`` -> ``<tok> <tok>_1 <tok>_2`` for an embedding of several vectors.

    An added token ``T`` whose companions ``T_1``, ``T_2``, ... are also in the vocabulary is
    written out in full, as diffusers' ``load_textual_inversion`` names the vectors and its
    pipelines expand prompts, so training and sampling read a prompt the same way.
    """
    added = tokenizer.get_added_vocab()
    for token in added:
        if f"{token}_1" not in added or token not in prompt:
            continue
        n = 1
        while f"{token}_{n}" in added:
            n += 1
        full = " ".join([token] + [f"{token}_{i}" for i in range(1, n)])
        prompt = re.sub(re.escape(token) + r"(?!_\d)", lambda _, f=full: f, prompt)
    return prompt


def encode_captions(model: Any, captions: list[str], clip_skip: int) -> TextConditioning:
    """The text conditioning of ``captions``, as the model's family makes it."""
    captions = [expand_multi_vector_tokens(c, model.tokenizer) for c in captions]
    return family_of(model).encode(model, captions, clip_skip)


def batch_loss(batch: Any, model: Any, cfg: TrainConfig, device: torch.device,
               dtype: torch.dtype) -> torch.Tensor:
    """The diffusion loss of one batch (noise, timesteps, UNet prediction, weighting)."""
    if batch.latents is not None:
        latents = batch.latents.to(device, dtype)
    else:
        with torch.no_grad():
            latents = encode_images(model.vae, batch.pixels).to(device, dtype)
    noise = offset_noise(torch.randn_like(latents), cfg.training.noise_offset)
    scheduler = model.noise_scheduler
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],),
                              device=device).long()
    noisy = scheduler.add_noise(latents, noise, timesteps)
    family = family_of(model)
    if batch.text is not None:
        text = batch.text.to(device, dtype)
    else:
        grad = any(enc.training for _, enc, _ in family.text_encoders(model))
        with torch.set_grad_enabled(grad):
            text = encode_captions(model, batch.captions, cfg.model.clip_skip)
    added = family.added_conditioning(text, batch.size_ids)
    pred = model.unet(noisy, timesteps, text.hidden, added_cond_kwargs=added).sample
    target = target_for(model.prediction_type, latents, noise, timesteps, scheduler)
    weights = batch.loss_weights.to(device).float()
    if cfg.training.min_snr_gamma is not None:
        snr = compute_snr(scheduler, timesteps)
        weights = weights * min_snr_weights(snr, cfg.training.min_snr_gamma,
                                            model.prediction_type)
    return diffusion_loss(pred, target, weights)
