"""Training state: save it, find the latest complete one, and resume exactly.

A state folder ``<output_name>-step<NNNNNNNN>-state/`` holds everything a continuation needs:

    trained.safetensors   every parameter the optimizer updates (LoRA layers, the UNet of a
                          DreamBooth run, the embedding matrix of textual inversion)
    optimizer.pt          the optimizer's state (moments, 8-bit quantization maps, step counts)
    scheduler.pt          the learning-rate schedule's state
    rng.pt                Python, NumPy, torch CPU and device generator states
    scaler.pt             fp16's gradient scaler, when there is one
    ema.pt                the EMA of the trained weights (training.ema_decay), when kept
    progress.json         step, epoch, batches of that epoch done, the gradient-accumulation
                          counter, the loss meter
    config.toml           the resolved config of the run

It is written under a hidden temporary name and renamed when complete (safe_write.atomic_dir),
so a folder with this name is always whole; :func:`find_latest` never offers anything else. On
resume the run is rebuilt from the config as at the start (the same seeds give the same
adapters), then the saved tensors, optimizer, schedule and generators replace what was built:
the data order is a pure function of (seed, epoch), so skipping the batches already done puts
the run exactly where it stopped.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from trainer.config import TrainConfig
from trainer.config import files as config_io

STATE_SUFFIX = "-state"
PROGRESS = "progress.json"
# Settings a resumed run may change: where and how often it saves and samples, and how far it
# goes. Everything else changes the run itself.
SAFE_KEYS = ("saving.", "sampling.", "training.max_train_steps", "training.max_train_epochs",
             "training.resume", "training.log_with", "training.logging_dir",
             "dataset.cache_latents_to_disk", "dataset.cache_dir")


class StateError(ValueError):
    """A state that cannot be resumed; the message names the setting and says what to do."""


@dataclass
class Progress:
    step: int = 0
    epoch: int = 1
    position: int = 0  # batches of ``epoch`` already trained
    micro_step: int = 0  # accelerate's gradient-accumulation counter
    losses: list[float] = field(default_factory=list)  # the meter's window
    sampled_at: Optional[int] = None

    def to_save(self, epoch_done: bool, micro_step: int, losses: list[float]) -> Progress:
        """What a state saves of the loop's progress: after a whole epoch, the next one's
        start (an epoch cut short by max_train_steps continues inside it)."""
        return Progress(step=self.step, epoch=self.epoch + 1 if epoch_done else self.epoch,
                        position=0 if epoch_done else self.position, micro_step=micro_step,
                        losses=list(losses), sampled_at=self.sampled_at)


def state_folder(cfg: TrainConfig, step: int) -> Path:
    return Path(cfg.saving.output_dir) / f"{cfg.saving.output_name}-step{step:08d}{STATE_SUFFIX}"


def _named_trained(s: Any) -> dict[str, torch.nn.Parameter]:
    """``module.parameter`` -> parameter, for every parameter the optimizer updates."""
    ids = {id(p) for g in s.optimizer.param_groups for p in g["params"]}
    out = {}
    for name in ("unet", "text_encoder", "text_encoder_2"):
        module = getattr(s.model, name, None)
        if module is not None:
            out.update({f"{name}.{n}": p for n, p in module.named_parameters() if id(p) in ids})
    return out


def _rng_state(s: Any) -> dict[str, Any]:
    from trainer.system.device import device_rng_state

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": (kind, torch.from_numpy(keys.copy()), pos,
                                                     has_gauss, gauss),
            "torch": torch.get_rng_state(), "device": device_rng_state(s.device_info)}


def _set_rng_state(s: Any, state: dict[str, Any]) -> None:
    from trainer.system.device import set_device_rng_state

    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    set_device_rng_state(s.device_info, state["device"])


def save_state(s: Any, progress: Progress) -> Optional[Path]:
    """Write the state of session ``s`` at ``progress``; returns the folder. With FSDP every
    process calls it: the shards are gathered whole (the files of a DDP state), rank 0 writes
    and the others return None."""
    from trainer.run.fsdp import gather
    from trainer.system.safe_write import atomic_dir

    folder = state_folder(s.cfg, progress.step)
    main = s.accelerator.is_main_process
    named = _named_trained(s)
    optimizer, ema = s.optimizer.state_dict(), s.ema.state_dict()
    if s.fsdp is not None:
        named, optimizer, ema = gather((named, optimizer, ema), keep=main)
    if not main:
        return None
    tensors = {k: p.detach().to("cpu").contiguous() for k, p in named.items()}
    with atomic_dir(folder) as tmp:
        save_file(tensors, str(tmp / "trained.safetensors"))
        torch.save(optimizer, tmp / "optimizer.pt")
        torch.save(s.scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(_rng_state(s), tmp / "rng.pt")
        scaler = getattr(s.accelerator, "scaler", None)
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        s.ema.save(tmp, ema)  # training.ema_decay: the shadow weights and their step count
        config_io.save(s.cfg, tmp / "config.toml")
        (tmp / PROGRESS).write_text(json.dumps(asdict(progress)), encoding="utf-8")
    return folder


def read_progress(folder: Path) -> Optional[Progress]:
    try:
        return Progress(**json.loads((folder / PROGRESS).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def find_latest(output_dir: Path) -> Optional[Path]:
    """The complete state with the most steps in ``output_dir`` (hidden folders are
    incomplete writes and never count)."""
    found = []
    if output_dir.is_dir():
        for folder in output_dir.iterdir():
            if folder.name.startswith(".") or not folder.name.endswith(STATE_SUFFIX):
                continue
            progress = read_progress(folder)
            if progress is not None and (folder / "trained.safetensors").is_file():
                found.append((progress.step, folder.stat().st_mtime, folder))
    return max(found)[2] if found else None


def resolve_resume(cfg: TrainConfig) -> Path:
    value = cfg.training.resume
    if value == "latest":
        latest = find_latest(Path(cfg.saving.output_dir))
        if latest is None:
            raise StateError(f"training.resume = 'latest': no complete state in "
                             f"{cfg.saving.output_dir}; turn saving.save_state on to make them")
        return latest
    if cfg.saving.resume_from_huggingface:  # sd-scripts' owner/name/<folder>[:rev[:type]]
        from trainer.run.hub import download_state

        folder = download_state(value)
    else:
        folder = Path(value).expanduser()
    if read_progress(folder) is None:
        raise StateError(f"training.resume = {value!r}: not a complete training state (a "
                         f"<name>-step<N>-state folder with {PROGRESS})")
    return folder


def _flat(cfg: TrainConfig) -> dict[str, Any]:
    out = {}
    for key, value in config_io.to_dict(cfg).items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        for name, v in items:
            out[f"{key}.{name}".strip(".")] = v
    return out


def changed_keys(saved: TrainConfig, now: TrainConfig) -> list[str]:
    """The settings that differ and matter for the run, as ``key (old -> new)``."""
    a, b = _flat(saved), _flat(now)
    return [f"{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not k.startswith(SAFE_KEYS)]


def load_state(s: Any, folder: Path) -> Progress:
    """Put the saved state into session ``s`` (built from the same config); returns where the
    run continues."""
    saved = config_io.load(folder / "config.toml")
    changed = changed_keys(saved, s.cfg)
    if changed:
        raise StateError(f"training.resume: the state in {folder} was trained with other "
                         f"settings: {'; '.join(changed)}. Set them back to resume, or start a "
                         f"new run")
    params = _named_trained(s)
    tensors = load_file(str(folder / "trained.safetensors"))
    if set(tensors) != set(params):
        raise StateError(f"training.resume: {folder} holds other trained parameters than this "
                         f"run trains; it belongs to another run")
    from trainer.run.fsdp import put, shard_state

    for name, param in params.items():
        put(param, tensors[name])  # FSDP: this process's rows
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    s.optimizer.load_state_dict(shard_state(optimizer, s.optimizer) if s.fsdp else optimizer)
    s.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    scaler = getattr(s.accelerator, "scaler", None)
    if scaler is not None and (folder / "scaler.pt").is_file():
        scaler.load_state_dict(torch.load(folder / "scaler.pt", weights_only=True))
    _set_rng_state(s, torch.load(folder / "rng.pt", weights_only=True))
    s.ema.load(folder)
    progress = read_progress(folder)
    s.accelerator.step = progress.micro_step
    return progress
