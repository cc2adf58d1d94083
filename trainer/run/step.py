"""One training step's forward pass: from a batch to the loss. Shared by every method."""

from __future__ import annotations

import re
from typing import Any

import torch
from diffusers.training_utils import compute_snr

from trainer.config import TrainConfig
from trainer.models.conditioning import TextConditioning, family_of
from trainer.objectives.losses import (
    debiased_weights,
    diffusion_loss,
    huber_threshold,
    min_snr_weights,
    offset_noise,
    pyramid_noise,
    sample_timesteps,
    target_for,
    v_pred_like_noise_pred_weights,
)
from trainer.system.distributed import narrow, widen


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


def sample_noise(latents: torch.Tensor, tr: Any) -> torch.Tensor:
    """Gaussian noise for ``latents``, with the noise offset and multires options of
    ``training`` (in sd-scripts' order: offset first)."""
    noise = torch.randn_like(latents)
    if tr.noise_offset:
        noise = offset_noise(noise, tr.noise_offset, latents=latents,
                             adaptive_scale=tr.adaptive_noise_scale,
                             random_strength=tr.noise_offset_random_strength)
    if tr.multires_noise_iterations:
        noise = pyramid_noise(noise, tr.multires_noise_iterations, tr.multires_noise_discount)
    return noise


def _needs_snr(tr: Any) -> bool:
    return (tr.min_snr_gamma is not None or tr.debiased_estimation_loss
            or tr.scale_v_pred_loss_like_noise_pred
            or (tr.loss_type in ("huber", "smooth_l1") and tr.huber_schedule == "snr"))


def _weights(batch: Any, tr: Any, snr: Any, prediction_type: str,
             device: torch.device) -> torch.Tensor:
    """Per-image loss weights: prior loss weight, then sd-scripts' order of min-SNR, v-pred
    scaling and debiased estimation."""
    weights = batch.loss_weights.to(device).float()
    if tr.min_snr_gamma is not None:
        weights = weights * min_snr_weights(snr, tr.min_snr_gamma, prediction_type)
    if tr.scale_v_pred_loss_like_noise_pred:
        if prediction_type != "v_prediction":
            raise ValueError("training.scale_v_pred_loss_like_noise_pred is for v-prediction "
                             "models; this model predicts epsilon: turn it off")
        weights = weights * v_pred_like_noise_pred_weights(snr)
    if tr.debiased_estimation_loss:
        weights = weights * debiased_weights(snr, prediction_type)
    return weights


def batch_loss(batch: Any, model: Any, cfg: TrainConfig, device: torch.device,
               dtype: torch.dtype) -> torch.Tensor:
    """The diffusion loss of one batch (noise, timesteps, UNet prediction, weighting)."""
    tr = cfg.training
    if batch.latents is not None:
        latents = batch.latents.to(device, dtype)
    else:
        with torch.no_grad():
            latents = encode_images(model.vae, batch.pixels).to(device, dtype)
    rows = getattr(batch, "rows", None)  # one process's share: draw for the global batch
    latents = widen(latents, rows)
    noise = sample_noise(latents, tr)
    scheduler = model.noise_scheduler
    num_timesteps = scheduler.config.num_train_timesteps
    timesteps = sample_timesteps(latents.shape[0], num_timesteps, tr.min_timestep,
                                 tr.max_timestep, device)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    latents, noise, timesteps, noisy = narrow(rows, latents, noise, timesteps, noisy)
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
    snr = compute_snr(scheduler, timesteps) if _needs_snr(tr) else None
    weights = _weights(batch, tr, snr, model.prediction_type, device)
    huber_c = None
    if tr.loss_type in ("huber", "smooth_l1"):
        huber_c = huber_threshold(tr.huber_schedule, tr.huber_c, tr.huber_scale, timesteps,
                                  num_timesteps, snr)
    mask = batch.mask.to(device) if batch.mask is not None else None
    return diffusion_loss(pred, target, weights, tr.loss_type, huber_c, mask)
