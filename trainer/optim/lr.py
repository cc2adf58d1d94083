"""What the loop needs of an optimizer besides its step: the learning rate it really uses, the
notes its settings call for, and schedule-free's averaged weights.

- D-Adaptation and Prodigy estimate a distance ``d`` and step with ``d * lr`` (Defazio &
  Mishchenko 2023, alg. 1; Mishchenko & Defazio 2023, alg. 1); sd-scripts logs it as ``d*lr``.
  The learning rate set is a multiplier, best near 1.0.
- Adafactor with ``relative_step`` steps with ``min(1e-2, 1/sqrt(t))``, times the weights' RMS
  with ``scale_parameter`` (Shazeer & Stern 2018, sec. 8; transformers' ``Adafactor._get_lr``).
- Schedule-free optimizers (Defazio et al. 2024) take gradients at one point ``y`` and average
  the iterates into ``x``; ``eval()`` puts ``x`` into the weights, ``train()`` puts ``y`` back.
  Samples, the validation loss and saved files use ``x``; their warm-up scales ``lr`` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from trainer.optim.optimizers import relative_step, spec

FAR = 10.0  # an adaptive optimizer's learning rate this far from 1.0 (either way) is noted


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it


def effective_lr(optimizer: Any, scheduler: Any) -> float:
    """The first group's learning rate as the optimizer applies it."""
    inner = _inner(optimizer)
    group = inner.param_groups[0]
    if "d" in group:  # D-Adaptation, Prodigy
        return float(group["d"] * group["lr"])
    if group.get("relative_step"):  # Adafactor
        for p in group["params"]:
            state = inner.state.get(p, {})
            if "step" in state:
                return float(inner._get_lr(group, state))
    if "scheduled_lr" in group and group.get("k", 0) > 0:  # schedule-free, warm-up included
        return float(group["scheduled_lr"])
    return float(scheduler.get_last_lr()[0])


def lr_label(section: Any) -> str:
    """How the run panel names the reported learning rate."""
    family = spec(section.optimizer_type).family
    if family == "adaptive":
        return "effective learning rate (d x lr)"
    if relative_step(section):
        return "effective learning rate (Adafactor relative step)"
    if family == "schedule_free" and (section.lr_warmup_steps
                                      or section.optimizer_args.get("warmup_steps")):
        return "effective learning rate (with warm-up)"
    return "learning rate"


def lr_notes(section: Any) -> list[str]:
    """Warnings the optimizer's settings call for, logged when training starts (sd-scripts
    logs the same for the adaptive ones)."""
    name, family = section.optimizer_type, spec(section.optimizer_type).family
    notes = []
    if family == "adaptive":
        lrs = {section.learning_rate, section.unet_lr, section.text_encoder_lr,
               section.text_encoder_2_lr} - {None}
        far = sorted(lr for lr in lrs if not 1 / FAR <= lr <= FAR)
        if far:
            notes.append(f"{name} multiplies its estimated step size by the learning rate: "
                         f"{', '.join(f'{lr:g}' for lr in far)} is far from the 1.0 it expects "
                         f"(set optimizer.learning_rate = 1.0 and the group rates near it)")
    if relative_step(section) and (section.unet_lr or section.text_encoder_lr
                                   or section.text_encoder_2_lr):
        notes.append("Adafactor with relative_step ignores optimizer.unet_lr and "
                     "optimizer.text_encoder_lr: it computes its own step size")
    return notes


def is_schedule_free(optimizer: Any) -> bool:
    inner = _inner(optimizer)
    return bool(inner is not None and inner.param_groups
                and "train_mode" in inner.param_groups[0])


@contextlib.contextmanager
def averaged_weights(optimizer: Any) -> Iterator[None]:
    """Within: a schedule-free optimizer's averaged weights ``x`` (its eval mode); after: its
    training point ``y`` again, bit for bit (``train()`` alone would recompute it with a
    rounding error, and a run that samples would then drift from one that does not). Other
    optimizers: nothing changes."""
    if optimizer is None or not is_schedule_free(optimizer):
        yield
        return
    inner = _inner(optimizer)
    params = [p for g in inner.param_groups for p in g["params"]]
    kept = [p.detach().to("cpu", copy=True) for p in params]
    inner.eval()
    try:
        yield
    finally:
        inner.train()
        with torch.no_grad():
            for p, y in zip(params, kept):
                p.copy_(y)
