"""Optimizers and learning-rate schedules, by name, from the config."""

from __future__ import annotations

from typing import Any

import torch

from trainer.config import OptimizerSection

# Backends on which bitsandbytes' 8-bit optimizers run (0.45+ has CPU, ROCm and XPU support).
BNB_BACKENDS = ("cuda", "rocm", "xpu", "cpu")


class OptimizerError(ValueError):
    """An optimizer that cannot run here; the message says which to pick instead."""


def make_optimizer(section: OptimizerSection, groups: list[dict[str, Any]], backend: str):
    name = section.optimizer_type
    args = dict(section.optimizer_args)
    groups = [{k: v for k, v in g.items() if k != "name"} for g in groups]
    lr, wd = section.learning_rate, section.weight_decay
    if name == "AdamW":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=wd, **args)
    if name in ("AdamW8bit", "Lion8bit"):
        bnb = _bitsandbytes(name, backend)
        cls = bnb.optim.AdamW8bit if name == "AdamW8bit" else bnb.optim.Lion8bit
        return cls(groups, lr=lr, weight_decay=wd, **args)
    if name == "Lion":
        from lion_pytorch import Lion

        return Lion(groups, lr=lr, weight_decay=wd, **args)
    if name == "Adafactor":
        from transformers.optimization import Adafactor

        args = {"relative_step": False, "scale_parameter": False, "warmup_init": False, **args}
        return Adafactor(groups, lr=lr, weight_decay=wd, **args)
    if name == "Prodigy":
        from prodigyopt import Prodigy

        return Prodigy(groups, lr=lr, weight_decay=wd, **args)
    raise OptimizerError(f"optimizer.optimizer_type = {name!r}: unknown optimizer")


def _bitsandbytes(name: str, backend: str):
    fallback = "AdamW" if name == "AdamW8bit" else "Lion"
    if backend not in BNB_BACKENDS:
        raise OptimizerError(
            f"optimizer.optimizer_type = {name!r}: bitsandbytes has no 8-bit optimizers for the "
            f"{backend} device; use {fallback!r}"
        )
    try:
        import bitsandbytes
    except Exception as exc:  # noqa: BLE001 - a broken native library raises anything
        raise OptimizerError(
            f"optimizer.optimizer_type = {name!r}: bitsandbytes cannot be loaded ({exc}); "
            f"use {fallback!r} or reinstall with setup.sh"
        ) from None
    return bitsandbytes


def make_scheduler(section: OptimizerSection, optimizer, total_steps: int):
    from diffusers.optimization import get_scheduler

    return get_scheduler(
        section.lr_scheduler, optimizer, num_warmup_steps=section.lr_warmup_steps,
        num_training_steps=total_steps, num_cycles=section.lr_scheduler_num_cycles,
        power=section.lr_scheduler_power,
    )
