"""One training step's forward pass: from a batch to the loss. Shared by every method."""

from __future__ import annotations

import re
from typing import Any

import torch

from trainer.config import TrainConfig
from trainer.families import family_of
from trainer.models.text_conditioning import TextConditioning
from trainer.objectives.ddpm import DDPMObjective
from trainer.objectives.losses import diffusion_loss
from trainer.system.distributed import narrow, widen


def encode_images(vae, pixels: torch.Tensor, family: Any = None) -> torch.Tensor:
    """Pixels in [-1, 1] -> scaled latents (the distribution's mode, so caching is exact): the
    family's own ``encode_latents(vae, pixels)`` where it has one (``family``: the model's
    family object), else ``(mode - shift_factor) * scaling_factor``; SD's VAEs have no shift,
    the 16-channel VAEs of FLUX.1 and SD 3.5 do (diffusers' pipelines decode with the
    inverse)."""
    own = getattr(family, "encode_latents", None)
    if own is not None:
        return own(vae, pixels)
    latents = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
    shift = vae.config.get("shift_factor") or 0.0
    return (latents - shift) * vae.config.scaling_factor


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


def encode_captions(model: Any, captions: list[str], clip_skip: int,
                    family: Any = None, controls: Any = None) -> TextConditioning:
    """The text conditioning of ``captions``, as the model's family (``family``, else the
    model's) makes it; ``controls``: the rows' control pixels, for a family whose text
    encoder reads them (``ControlSpec.text``)."""
    captions = [expand_multi_vector_tokens(c, model.tokenizer) for c in captions]
    extra = {"controls": controls} if controls else {}
    return (family_of(model) if family is None else family).encode(model, captions, clip_skip,
                                                                   **extra)


def text_controls(batch: Any, model: Any) -> Any:
    """The batch's control pixels where the model's family reads them in its text encoder."""
    from trainer.families import spec

    pixels = getattr(batch, "control_pixels", None)
    return pixels if pixels and spec(model.version).controls.text else None


def run_family(model: Any, cfg: TrainConfig) -> Any:
    """The family object of a run: the model's, given the run's guidance once."""
    from trainer.families import family

    return family(model.version, guidance=cfg.flow.guidance_scale)


def objective_for(model: Any, cfg: TrainConfig) -> Any:
    """The family's objective: DDPM for SD 1.x, 2.x and SDXL, flow matching for FLUX.1 and
    SD 3.5 (trainer/objectives/). A run builds it once (``Session.objective``)."""
    from trainer.families import spec

    if spec(model.version).objective == "flow":
        from trainer.objectives.flow_matching import FlowObjective

        return FlowObjective(cfg.flow, cfg.training, getattr(model, "noise_scheduler", None))
    return DDPMObjective(cfg.training, model.noise_scheduler, model.prediction_type)


def control_latents(batch: Any, model: Any, family: Any, device: torch.device,
                    dtype: torch.dtype) -> list[torch.Tensor]:
    """Edit training: the latents of the batch's control images, one [B, C, h, w] per reference
    index (cached, or encoded here like the targets); empty without controls."""
    if getattr(batch, "controls", None):  # cached (pixels may come too, for the text)
        return [c.to(device, dtype) for c in batch.controls]
    with torch.no_grad():
        return [encode_images(model.vae, px, family).to(device, dtype)
                for px in getattr(batch, "control_pixels", None) or ()]


def batch_loss(batch: Any, model: Any, cfg: TrainConfig, device: torch.device,
               dtype: torch.dtype, family: Any = None, objective: Any = None) -> torch.Tensor:
    """The loss of one batch: the objective draws noise and timesteps and gives the target and
    weights, the family calls the denoiser. ``family`` and ``objective``: the run's (its
    Session's), else made for this batch."""
    family = run_family(model, cfg) if family is None else family
    objective = objective_for(model, cfg) if objective is None else objective
    if batch.latents is not None:
        latents = batch.latents.to(device, dtype)
    else:
        with torch.no_grad():
            latents = encode_images(model.vae, batch.pixels, family).to(device, dtype)
    rows = getattr(batch, "rows", None)  # one process's share: draw for the global batch
    latents = widen(latents, rows)
    noise = objective.sample_noise(latents)
    t = objective.sample_t(latents)
    noisy = objective.noisy(latents, noise, t)
    latents, noise, t, noisy = narrow(rows, latents, noise, t, noisy)
    if batch.text is not None:
        text = batch.text.to(device, dtype)
    else:
        grad = any(enc.training for _, enc, _ in family.text_encoders(model))
        with torch.set_grad_enabled(grad):
            # at the denoiser's dtype, as the cache gives it: a trained text encoder (or a
            # textual-inversion embedding) returns fp32 where frozen bf16 weights need bf16
            pixels = text_controls(batch, model)  # an edit family's text reads its controls
            text = encode_captions(model, batch.captions, cfg.model.clip_skip,
                                   **({"controls": pixels} if pixels else {})
                                   ).to(device, dtype)
    controls = control_latents(batch, model, family, device, dtype)
    # an edit family's predict takes the controls' latents, one tensor per reference index
    extra = {"controls": controls} if controls else {}
    pred = family.predict(model, noisy, t, text, batch.size_ids, **extra)
    pred = objective.prediction(pred, noisy, t)
    target = objective.target(latents, noise, t)
    weights = objective.weights(batch.loss_weights.to(device), t)
    mask = batch.mask.to(device) if batch.mask is not None else None
    return diffusion_loss(pred, target, weights, cfg.training.loss_type, objective.huber_c(t),
                          mask)
