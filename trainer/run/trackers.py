"""``training.log_with``: the trackers of accelerate that a run writes to, as sd-scripts'
``--log_with`` names them: ``tensorboard``, ``wandb`` (Weights & Biases) or ``all`` (both).
``log_tracker_name`` names the run in each (TensorBoard's folder under the logging dir, the
W&B project; unset: saving.output_name) and ``wandb_run_name`` the W&B run. W&B writes its
files under the logging dir too; without an account it runs with ``WANDB_MODE=offline`` (then
``wandb sync`` uploads later), and it reads its key from ``WANDB_API_KEY`` or ``wandb login``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

TRACKERS = {"none": None, "tensorboard": ["tensorboard"], "wandb": ["wandb"],
            "all": ["tensorboard", "wandb"]}


def log_with(cfg: Any) -> Optional[list[str]]:
    """accelerate's ``log_with``: the tracker names, None for no tracker; raises ValueError
    when W&B is asked for and not installed."""
    names = TRACKERS[cfg.training.log_with]
    problem = wandb_problem() if names and "wandb" in names else None
    if problem:
        raise ValueError(problem)
    return names


def project_name(cfg: Any) -> str:
    return cfg.training.log_tracker_name or cfg.saving.output_name


def init_kwargs(cfg: Any, log_dir: Path) -> dict[str, dict[str, Any]]:
    """Per-tracker arguments of ``init_trackers``: W&B's run name and its folder."""
    if "wandb" not in (TRACKERS[cfg.training.log_with] or []):
        return {}
    log_dir.mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir otherwise
    wandb: dict[str, Any] = {"dir": str(log_dir)}
    if cfg.training.wandb_run_name:
        wandb["name"] = cfg.training.wandb_run_name
    return {"wandb": wandb}


def wandb_problem() -> Optional[str]:
    """Why W&B cannot log here (the package missing), else None."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return ("training.log_with = 'wandb' needs the wandb package (pip install wandb); or "
                "log_with = 'tensorboard'")
    return None
