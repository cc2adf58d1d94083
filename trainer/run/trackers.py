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
    """Per-tracker arguments of ``init_trackers``: W&B's run name and its folder, then the
    tables of training.log_tracker_config over them."""
    out: dict[str, dict[str, Any]] = {}
    if "wandb" in (TRACKERS[cfg.training.log_with] or []):
        log_dir.mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir otherwise
        out["wandb"] = {"dir": str(log_dir)}
        if cfg.training.wandb_run_name:
            out["wandb"]["name"] = cfg.training.wandb_run_name
    for tracker, values in tracker_config(cfg.training.log_tracker_config).items():
        out[tracker] = {**out.get(tracker, {}), **values}
    return out


def tracker_config(path: Optional[str]) -> dict[str, dict[str, Any]]:
    """sd-scripts' --log_tracker_config: a TOML of one table of init arguments per tracker;
    ValueError naming training.log_tracker_config when it cannot be read."""
    import tomllib

    if not path:
        return {}
    where = f"training.log_tracker_config = {path!r}"
    try:
        data = tomllib.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{where}: cannot read it as TOML ({exc})") from None
    flat = [k for k, v in data.items() if not isinstance(v, dict)]
    if flat:
        raise ValueError(f"{where}: {', '.join(flat)} must be inside a table named after its "
                         f"tracker ([wandb], [tensorboard])")
    return data


def wandb_problem() -> Optional[str]:
    """Why W&B cannot log here (the package missing), else None."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        return ("training.log_with = 'wandb' needs the wandb package (pip install wandb); or "
                "log_with = 'tensorboard'")
    return None
