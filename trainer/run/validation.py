"""The validation loss: the diffusion loss on images the run does not train on.

The images are ``dataset.validation_split`` (held out of the training images) or
``dataset.validation_data_dir`` (trainer/data/split.py). A training loss jumps from step to step
because every step draws new timesteps and new noise; a validation loss is only worth comparing
across steps when those stay put, so each image is scored at the same few timesteps spread over
the schedule (:data:`TIMESTEP_FRACTIONS`) with noise drawn once from a generator seeded by
``training.seed`` and the image's position. What changes between two measurements is then the
model alone. The images are encoded once, without flips, crops at random or caption changes;
edit training's held-out images keep their control images (their latents beside the target's,
their pixels for a text encoder that reads them).
The training loss's options (loss_type, masked_loss, min-SNR, debiased or v-scaled weights,
noise offset, multires noise, timestep bounds) do not apply: it is the plain mean squared error,
comparable between runs that set them differently.

It runs every ``training.validate_every_n_steps`` steps (unset: at every epoch's end) and at the
last step, with the model in eval mode and no gradients, then puts the train modes back. Its
randomness comes from its own generators, so the training run is the same with or without it.
The result goes out as a :class:`~trainer.events.Validation` event, a log line and, with
TensorBoard logging, the ``val_loss`` scalar.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from trainer.events import Validation

# Where on the noise schedule each image is scored: fractions of the DDPM schedule's length,
# and the same numbers as sigmas for flow matching (the objectives' validation_t)
TIMESTEP_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
SEED_OFFSET = 7919  # keeps the validation noise apart from anything seeded by training.seed
_SETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # TrainingData -> ValidationSet


@dataclass
class ValidationItem:
    latents: torch.Tensor  # [1, C, h, w] on the CPU, encoded once
    caption: str
    size_ids: torch.Tensor  # [1, 6]
    noise: torch.Tensor  # [K, C, h, w], fixed
    controls: list = field(default_factory=list)  # edit training: each control's latents
    control_pixels: list = field(default_factory=list)  # and pixels [1, 3, H, W]


@dataclass
class ValidationSet:
    items: list[ValidationItem]
    timesteps: torch.Tensor  # [K]: DDPM timesteps, or flow matching's sigmas


def validation_data(data: Any, cfg: Any, family: Optional[str] = None) -> Any:
    """The held-out images as a TrainingData without per-step changes (no flips, no crops at
    random, no caption shuffle or dropout), with their control images where they have them
    (sized as ``family``, the model's, declares)."""
    from trainer.data import TrainingData
    from trainer.data.captions import CaptionOptions

    held = TrainingData(list(data.held_out), cfg, data.train_dir)
    held.flip_aug = held.random_crop = False
    ds = cfg.dataset
    held.caption_options = CaptionOptions(prefix=ds.caption_prefix, suffix=ds.caption_suffix)
    held.steady()  # the same for a dataset TOML's per-subset options
    if getattr(data, "held_out_controls", None):
        held.use_controls(data.held_out_controls, family)
    return held


def build_set(data: Any, model: Any, cfg: Any, objective: Any = None) -> ValidationSet:
    """Encode the validation images once and draw their fixed noise; ``objective``: the run's
    (else the model's is made)."""
    from trainer.families import family_of
    from trainer.run.step import encode_images, objective_for

    held = validation_data(data, cfg, model.version)
    seed = cfg.training.seed
    objective = objective_for(model, cfg) if objective is None else objective
    timesteps = objective.validation_t()
    items = []
    for index in range(held.num_images):
        batch = held._batch([index], random.Random(f"{seed}:validation:{index}"))
        pixels = batch.control_pixels or []
        with torch.no_grad():
            latents, *controls = (encode_images(model.vae, px, family_of(model)).float().cpu()
                                  for px in [batch.pixels, *pixels])
        generator = torch.Generator().manual_seed(seed + SEED_OFFSET + index)
        noise = torch.randn((len(timesteps), *latents.shape[1:]), generator=generator)
        items.append(ValidationItem(latents, batch.captions[0], batch.size_ids, noise,
                                    controls, pixels))
    return ValidationSet(items, timesteps)


@dataclass
class Steady:
    """A validation item's control pixels as :func:`~trainer.run.step.text_controls` reads a
    batch's."""

    control_pixels: list


def _item_loss(item: ValidationItem, timesteps: torch.Tensor, model: Any, cfg: Any,
               device: Any, dtype: torch.dtype, chunk: int, run: tuple[Any, Any]) -> float:
    from trainer.objectives.losses import diffusion_loss
    from trainer.run.step import encode_captions, text_controls

    family, objective = run
    total = 0.0
    for start in range(0, len(timesteps), chunk):
        t = timesteps[start:start + chunk].to(device)
        n = len(t)
        latents = item.latents.to(device, dtype).expand(n, -1, -1, -1)
        noise = item.noise[start:start + n].to(device, dtype)
        noisy = objective.noisy(latents, noise, t)
        wide = [c.expand(n, -1, -1, -1) for c in item.control_pixels]
        controls = [c.to(device, dtype).expand(n, -1, -1, -1) for c in item.controls]
        text = encode_captions(model, [item.caption] * n, cfg.model.clip_skip,
                               controls=text_controls(Steady(wide), model)).to(device, dtype)
        extra = {"controls": controls} if controls else {}  # as batch_loss passes them
        pred = family.predict(model, noisy, t, text, item.size_ids.expand(n, -1), **extra)
        pred = objective.prediction(pred, noisy, t)
        target = objective.target(latents, noise, t)
        total += diffusion_loss(pred, target).item() * n
    return total / len(timesteps)


def _networks(model: Any) -> list[Any]:
    from trainer.families import family_of

    return [model.denoiser] + [enc for _, enc, _ in family_of(model).text_encoders(model)]


def validation_loss(vset: ValidationSet, model: Any, cfg: Any, device: Any,
                    dtype: torch.dtype, family: Any = None, objective: Any = None) -> float:
    """The mean loss over the validation images and the fixed timesteps, in eval mode;
    ``family`` and ``objective``: the run's (else the model's are made)."""
    from trainer.run.step import objective_for, run_family

    run = (run_family(model, cfg) if family is None else family,
           objective_for(model, cfg) if objective is None else objective)
    modes = [(m, m.training) for m in _networks(model)]
    chunk = max(1, cfg.training.train_batch_size)
    try:
        for module, _ in modes:
            module.eval()
        with torch.no_grad():
            losses = [_item_loss(item, vset.timesteps, model, cfg, device, dtype, chunk, run)
                      for item in vset.items]
    finally:
        for module, was_training in modes:
            module.train(was_training)
    return sum(losses) / len(losses)


def due(cfg: Any, step: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Whether the validation loss is measured after ``step``."""
    every = cfg.training.validate_every_n_steps or steps_per_epoch
    return step % every == 0 or step == total_steps


def maybe_validate(session: Any, step: int, out: Any) -> Optional[float]:
    """Measure and report the validation loss when it is due; None when not (or no images).
    ``out`` is the loop's reporter (``log`` and ``emit``)."""
    data, cfg, plan = session.data, session.cfg, session.plan
    if data is None or not data.held_out or not due(cfg, step, plan.steps_per_epoch,
                                                   plan.total_steps):
        return None
    vset = _SETS.get(data)
    if vset is None:
        vset = _SETS[data] = build_set(data, session.model, cfg, session.objective)
    from trainer.optim.lr import averaged_weights  # schedule-free: the averaged weights

    with averaged_weights(session.optimizer):
        loss = validation_loss(vset, session.model, cfg, session.accelerator.device,
                               session.dtype, session.family, session.objective)
    out.emit(Validation(step=step, loss=loss, images=len(vset.items)))
    out.log(f"Validation loss at step {step}: {loss:.5f} ({len(vset.items)} image(s) x "
            f"{len(vset.timesteps)} fixed timesteps)")
    if cfg.training.log_with != "none":
        session.accelerator.log({"val_loss": loss}, step=step)
    return loss
