"""Failures that say what to do: each check raises an error whose message names the setting or
the file, what happened, and what usually fixes it. They are ValueErrors, so the loop reports
their message as the run's error without a traceback.
"""

from __future__ import annotations

import errno
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from trainer.config import TrainConfig


class OutputDirError(ValueError):
    """saving.output_dir cannot receive the run's files."""


class NonFiniteError(ValueError):
    """The loss or the gradient norm of a step is not a finite number."""


class OutOfMemory(ValueError):
    """The device ran out of memory; the message has advice for this config."""


class DiskFullError(ValueError):
    """A save found the disk full; the previous file is intact."""


def check_output_dir(cfg: TrainConfig) -> Path:
    """Make sure ``saving.output_dir`` is a folder this process can write, before anything heavy
    loads; clear temporary files that a killed save left (hidden ``.*.tmp`` names)."""
    folder = Path(cfg.saving.output_dir).expanduser()
    where = f"saving.output_dir = {str(folder)!r}"
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"{where} is a file, not a folder; choose a folder for the outputs")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise OutputDirError(f"{where}: cannot write there ({exc.strerror or exc}); choose a "
                             f"folder you can write to") from None
    for leftover in folder.glob(".*.tmp"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)
    return folder


def _causes(cfg: TrainConfig, precision: str) -> str:
    lr = cfg.optimizer.learning_rate
    tips = [f"a learning rate too high (optimizer.learning_rate = {lr:g}: try a tenth)"]
    if precision == "fp16":
        tips.append("fp16 overflow (try training.mixed_precision = 'bf16', or 'no')")
    tips.append("a broken image in the batch")
    return "; ".join(tips)


def check_loss(loss: Any, step: int, cfg: TrainConfig, precision: str,
               paths: Optional[list] = None) -> None:
    """Raise before the backward pass when the loss is not finite: nothing of the step is
    applied, and the last saved file stays as it was."""
    value = float(loss.detach())
    if math.isfinite(value):
        return
    images = ", ".join(str(p) for p in paths or [])
    raise NonFiniteError(
        f"step {step}: the loss is {value} (not a finite number); the step was not applied and "
        f"the last saved file is kept. Usual causes: {_causes(cfg, precision)}"
        + (f". The batch held: {images}" if images else ""))


def check_grad_norm(norm: Any, step: int, cfg: TrainConfig, precision: str) -> None:
    """Raise before the optimizer step when the gradients are not finite. With fp16 the
    gradient scaler skips such steps and lowers its scale, as it should: no error there."""
    if precision == "fp16" or norm is None:
        return
    value = float(norm)
    if not math.isfinite(value):
        raise NonFiniteError(
            f"step {step}: the gradient norm is {value}; the step was not applied and the "
            f"last saved file is kept. Usual causes: {_causes(cfg, precision)}")


def memory_advice(cfg: TrainConfig) -> list[str]:
    """What to change first for a config that did not fit, most effective first."""
    ds, tr, opt = cfg.dataset, cfg.training, cfg.optimizer
    advice = []
    if tr.train_batch_size > 1:
        advice.append(f"training.train_batch_size = {tr.train_batch_size // 2} (with "
                      f"training.gradient_accumulation_steps = "
                      f"{tr.gradient_accumulation_steps * 2} to keep the effective batch)")
    if not tr.gradient_checkpointing:
        advice.append("training.gradient_checkpointing = true")
    if tr.mixed_precision in ("auto", "no") and not tr.full_bf16:
        advice.append("training.mixed_precision = 'bf16' (or 'fp16' where bf16 is missing)")
    if not ds.cache_latents and not ds.color_aug:  # colour augmentation rules the cache out
        advice.append("dataset.cache_latents = true")
    if opt.optimizer_type in ("AdamW", "Lion"):
        advice.append(f"optimizer.optimizer_type = '{opt.optimizer_type}8bit'")
    from trainer.config.sections.resolution import long_side, scaled

    if long_side(ds.resolution) > 512:  # 256 px off the longer side, the other in proportion
        lower = scaled(ds.resolution, max(512, long_side(ds.resolution) - 256)
                       / long_side(ds.resolution), step=8, floor=64)
        advice.append(f"dataset.resolution = {lower}")
    return advice


def out_of_memory(cfg: TrainConfig, info: Any, step: int) -> OutOfMemory:
    from trainer.system.device import format_bytes, memory_in_use

    used = memory_in_use(info) if info is not None else None
    held = f"{format_bytes(used)} in use" if used else "memory full"
    total = f" of {format_bytes(info.memory_bytes)}" if info is not None and \
        info.memory_bytes else ""
    tips = memory_advice(cfg) or ["a smaller model or a device with more memory"]
    return OutOfMemory(f"out of device memory at step {step} ({held}{total}); the memory was "
                       f"released. For this config try, in this order: {'; '.join(tips)}")


def disk_full(exc: OSError, path: Path) -> Optional[DiskFullError]:
    """A DiskFullError for an OSError that is ENOSPC (None for other errors)."""
    if exc.errno != errno.ENOSPC:
        return None
    try:
        free = shutil.disk_usage(path.parent).free
        room = f"{free / 2**20:.0f} MiB free"
    except OSError:
        room = "no room"
    kept = (f"the previous {path.name} is intact" if path.exists()
            else "nothing was written under that name")
    return DiskFullError(f"saving {path}: the disk is full ({room} in {path.parent}); {kept}. "
                         f"Free some space, or set saving.output_dir to another disk")


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    oom = getattr(torch, "OutOfMemoryError", None)
    return oom is not None and isinstance(exc, oom)
