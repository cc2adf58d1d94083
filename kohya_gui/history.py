"""The job history, kept in the data folder so that a restarted server still lists past runs
and can resume the ones that saved a training state.

Each entry is what the page shows of a finished job (id, label, status, output) plus what a
resume needs: the resolved config the run wrote beside its outputs (``config_path``) and its
last training state (``state``). The file is rewritten atomically after every change; a file
that cannot be read is set aside (renamed ``jobs.json.broken``) and the history starts empty.

A running job is in the file too (status ``running``, its config and, after each save, its last
training state), so that when the studio's process is killed mid-run the next start lists that
run as ``interrupted`` and can resume it. One studio process at a time owns a data folder's
history: :func:`lock` takes an exclusive ``flock`` on ``jobs.json.lock`` (released by the kernel
when the process dies, even by SIGKILL); a second process is refused with a message that names
the first one's pid.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Optional

from trainer.config import TrainConfig
from trainer.config import files as config_io

log = logging.getLogger(__name__)

HISTORY_FILE = "jobs.json"
RESUMABLE = ("stopped", "failed", "finished", "interrupted")
RUNNING, INTERRUPTED = "running", "interrupted"
_locks: dict[str, list] = {}  # path -> [open lock file, users in this process]
_locks_guard = threading.Lock()


class HistoryLocked(RuntimeError):
    """Another studio process holds the data folder's job history."""


def lock(path: Path) -> None:
    """Own ``path``'s history for this process (re-entrant within it); raises HistoryLocked
    when another process owns it."""
    import fcntl

    key = str(Path(path).resolve())
    with _locks_guard:
        if key in _locks:
            _locks[key][1] += 1
            return
        lock_path = Path(key + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held until unlock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise HistoryLocked(
                f"another Kohya Studio (pid {owner}) is using the data folder "
                f"{lock_path.parent}: stop it first, or start this one with another data folder "
                f"(KOHYA_STUDIO_HOME=/some/other/folder)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        _locks[key] = [handle, 1]


def unlock(path: Path) -> None:
    key = str(Path(path).resolve())
    with _locks_guard:
        held = _locks.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _locks[key]
            held[0].close()  # closing the file releases the flock


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
        for entry in entries:  # a run that was going when the studio's process died
            if entry.get("status") in (RUNNING, "queued"):
                entry["status"] = INTERRUPTED
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
