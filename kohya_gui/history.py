"""The job history, kept in the data folder so that a restarted server still lists past runs
and can resume the ones that saved a training state.

Each entry is what the page shows of a finished job (id, label, status, output) plus what a
resume needs: the resolved config the run wrote beside its outputs (``config_path``) and its
last training state (``state``). The file is rewritten atomically after every change; a file
that cannot be read is set aside (renamed ``jobs.json.broken``) and the history starts empty.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

from trainer.config import TrainConfig
from trainer.config import files as config_io

log = logging.getLogger(__name__)

HISTORY_FILE = "jobs.json"
RESUMABLE = ("stopped", "failed", "finished")


class HistoryLocked(RuntimeError):
    """Another studio process holds the data folder's job history."""


def default_path() -> Path:
    from trainer.config.paths import data_home

    return data_home() / HISTORY_FILE


def load_history(path: Path) -> list[dict[str, Any]]:
    """The saved entries, newest first ([] when there is no file or it is broken)."""
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ValueError("not a list of jobs")
        return entries
    except (OSError, ValueError) as exc:
        broken = path.with_name(path.name + ".broken")
        log.warning("the job history %s cannot be read (%s); it is kept as %s", path, exc,
                    broken)
        path.replace(broken)
        return []


def save_history(path: Path, entries: list[dict[str, Any]]) -> None:
    from trainer.system.safe_write import atomic_path

    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(entries, default=str), encoding="utf-8")
    except OSError:  # the history is a convenience: a read-only data folder must not stop runs
        log.exception("the job history could not be written to %s", path)


def can_resume(entry: dict[str, Any]) -> bool:
    """A run that ended with a complete training state and whose config is still there."""
    from trainer.run.state import read_progress

    state, config = entry.get("state"), entry.get("config_path")
    return (entry.get("status") in RESUMABLE and bool(state) and bool(config)
            and Path(config).is_file() and read_progress(Path(state)) is not None)


def resumable(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if can_resume(e)]


def resume_config(entry: dict[str, Any]) -> TrainConfig:
    """The run's own config, continuing from its last state (raises ConfigError)."""
    cfg = config_io.load(entry["config_path"])
    return cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"resume": entry["state"]})})


def find(entries: list[dict[str, Any]], job_id: Optional[str]) -> Optional[dict[str, Any]]:
    return next((e for e in entries if e.get("job_id") == job_id), None)
