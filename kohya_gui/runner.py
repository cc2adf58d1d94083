"""One training job at a time, a small queue behind it, and a state snapshot that pages poll.

The runner owns the trainer thread. ``trainer.run.loop.run(cfg, sink, control)`` runs on it; its
events go to a :class:`QueueSink` that folds them into a :class:`JobState` under the runner's
lock. Pages never hold the job: they poll :meth:`Runner.snapshot` with a ``gr.Timer``, so a
reloaded page or a second tab sees the same run. Stop goes through ``Control.request_stop()``
and ends the run at the next step boundary. After each run the runner keeps no reference to
anything the trainer built, collects garbage and empties the device cache.
"""

from __future__ import annotations

import collections
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from kohya_gui import history
from kohya_gui.job_state import IDLE, TERMINAL, JobState, curve, smooth  # noqa: F401
from trainer.config import TrainConfig
from trainer.config import files as config_io
from trainer.events import Checkpoint, Control, Event, EventSink, Finished

log = logging.getLogger(__name__)

RunFn = Callable[[TrainConfig, EventSink, Control], Optional[Finished]]


def default_run(cfg: TrainConfig, sink: EventSink, control: Control) -> Finished:
    from trainer.run.launch import needs_launch, run_launched

    if needs_launch(cfg):  # more than one process: a subprocess whose rank 0 reports back
        return run_launched(cfg, sink, control)
    from trainer.run.loop import run

    return run(cfg, sink, control)


def config_copy_path(cfg: TrainConfig) -> Path:
    """Where the resolved config of a run goes: beside its outputs."""
    return Path(cfg.saving.output_dir).expanduser() / f"{cfg.saving.output_name}.toml"


@dataclass
class Job:
    id: str
    cfg: Optional[TrainConfig]
    label: str
    status: str = "queued"
    control: Control = field(default_factory=Control)
    submitted: float = field(default_factory=time.time)


class QueueSink:
    """The EventSink of one job: folds its events into the runner's state, under its lock."""

    def __init__(self, runner: Runner, job: Job):
        self._runner, self._job = runner, job

    def emit(self, event: Event) -> None:
        self._runner._apply(self._job, event)


class QueueFull(RuntimeError):
    pass


class Runner:
    """Runs queued jobs one at a time on its own thread; everything else reads snapshots."""

    def __init__(self, run_fn: RunFn | None = None, *, max_queue: int = 32,
                 write_config: bool = True, on_start: Callable[[Job], None] | None = None,
                 device_info: Any = None, log_lines: int = 200,
                 history_path: Path | None = None):
        self._run_fn = run_fn or default_run
        self.max_queue, self.write_config, self.on_start = max_queue, write_config, on_start
        self._device_info, self._log_lines = device_info, log_lines
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._current: Job | None = None
        self._next: Job | None = None  # promoted, for the trainer thread to pick up
        self._state: JobState | None = None
        # past runs, kept in history_path (the data folder) across restarts of the server
        self.history_path = history_path
        if history_path is not None:
            history.lock(history_path)  # one studio process per data folder (HistoryLocked)
        past = history.load_history(history_path) if history_path else []
        self._history: collections.deque[dict[str, Any]] = collections.deque(past, maxlen=20)
        self._ids = itertools.count(1 + max((_job_number(e) for e in past), default=0))
        self._version = 0
        self._closed = self._unlocked = False
        self._thread = threading.Thread(target=self._worker, name="kohya-trainer", daemon=True)
        self._thread.start()

    # --- requests from pages ---

    def submit(self, cfg: TrainConfig, label: str | None = None) -> dict[str, Any]:
        """Queue a job; it starts at once when nothing runs. Raises QueueFull."""
        with self._cond:
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} jobs waiting); "
                                "cancel one or wait")
            job = Job(f"job-{next(self._ids)}", cfg,
                      label or f"{cfg.mode}: {cfg.saving.output_name}")
            self._queue.append(job)
            self._promote()
            position = self._queue.index(job) + 1 if job in self._queue else 0
            self._bump()
        if position:
            message = f"{job.id} queued (position {position}); it starts when the running job ends"
        else:
            message = f"{job.id} started"
        return {"job_id": job.id, "status": "queued" if position else "running",
                "position": position, "message": message}

    def cancel(self, job_id: str) -> str:
        with self._cond:
            for job in self._queue:
                if job.id == job_id:
                    self._queue.remove(job)
                    job.status = "cancelled"
                    self._remember({"job_id": job.id, "label": job.label,
                                    "status": "cancelled", "output_path": None})
                    self._bump()
                    return f"{job_id} cancelled"
            if self._current is not None and self._current.id == job_id:
                return f"{job_id} is running; use Stop to end it"
        return f"{job_id} is not in the queue"

    def resume(self, job_id: str | None) -> str:
        """Queue a past run again, continuing from its last training state."""
        with self._cond:
            entry = history.find(list(self._history), job_id)
        if entry is None or not history.can_resume(entry):
            return f"{job_id or 'no run'} cannot be resumed: choose a run that saved a state"
        try:
            cfg = history.resume_config(entry)
            answer = self.submit(cfg, label=f"{entry['label']} (resumed)")
        except (config_io.ConfigError, QueueFull) as exc:
            return f"{job_id} cannot be resumed: {exc}"
        return f"{answer['message']}; it continues {entry['job_id']} from {entry['state']}"

    def _remember(self, entry: dict[str, Any]) -> None:
        """Add a finished job to the history and keep the history on disk (lock held)."""
        self._history.appendleft(entry)
        if self.history_path is not None:
            history.save_history(self.history_path, list(self._history))

    def stop(self) -> str:
        """Ask the running job to stop at its next step boundary."""
        with self._cond:
            job, state = self._current, self._state
            if job is None or state is None:
                return "nothing is running"
            job.control.request_stop()
            if not state.stop_requested:
                state.stop_requested = True
                state.note("stop requested: stopping at the next step boundary")
                self._bump()
        return f"stopping {job.id} at the next step boundary"

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of the state: the running (or last) job, the queue, the history."""
        with self._cond:
            snap = dict(IDLE) if self._state is None else self._state.to_dict()
            if self._current is not None:
                snap["status"] = "running"
            elif self._queue:
                snap["status"] = "queued"
            snap["queue"] = [{"job_id": j.id, "label": j.label, "position": i + 1}
                             for i, j in enumerate(self._queue)]
            snap["history"] = [dict(h) for h in self._history]
            snap["resumable"] = [[f"{e['job_id']} {e['label']} ({e['status']})", e["job_id"]]
                                 for e in history.resumable(list(self._history))]
            snap["version"] = self._version
            return snap

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until no job runs or waits (for scripts and tests)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._current is not None or self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop the running job, drop the queue and end the thread; the data folder's history
        is free for another studio process once the running job has ended."""
        with self._cond:
            self._queue.clear()
            self._closed = True
            if self._current is not None:
                self._current.control.request_stop()
            self._cond.notify_all()
        if self.history_path is not None and not self._unlocked:
            self._unlocked = True
            path = self.history_path

            def release() -> None:
                self._thread.join(timeout=600)
                history.unlock(path)

            threading.Thread(target=release, name="kohya-history-unlock", daemon=True).start()

    # --- the trainer thread ---

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _apply(self, job: Job, event: Event) -> None:
        with self._cond:
            if self._state is not None and self._state.job_id == job.id:
                self._state.apply(event)
                if isinstance(event, Checkpoint) and event.state:
                    self._remember_running(job)  # a kill after this resumes from here
                self._bump()

    def _running_entry(self, job: Job) -> dict[str, Any]:
        state = self._state
        return {"job_id": job.id, "label": job.label, "status": history.RUNNING,
                "output_path": None, "config_path": state.config_path if state else None,
                "state": state.last_state if state else None,
                "started_at": state.started_at if state else time.time()}

    def _remember_running(self, job: Job) -> None:
        """Keep the running job in the history file (lock held): on the next start of the
        studio it reads as interrupted, with its last saved state."""
        self._forget(job.id)
        self._remember(self._running_entry(job))

    def _forget(self, job_id: str) -> None:
        for entry in [e for e in self._history if e.get("job_id") == job_id]:
            self._history.remove(entry)

    def _promote(self) -> None:
        """Start the first queued job when nothing runs (call with the lock held)."""
        if self._current is None and self._queue and not self._closed:
            job = self._queue.popleft()
            job.status = "running"
            self._current, self._state, self._next = job, JobState(job, self._log_lines), job
            self._bump()

    def _worker(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job, self._next = self._next, None
            self._run(job)

    def _run(self, job: Job) -> None:
        sink = QueueSink(self, job)
        result: Finished | None = None
        try:
            self._prepare(job)
            result = self._run_fn(job.cfg, sink, job.control)
        except Exception as exc:  # noqa: BLE001 - a crash ends this job, not the runner
            log.exception("training job %s crashed", job.id)
            result = Finished(status="failed", step=self._state.step if self._state else 0,
                              error=plain_error(exc))
        with self._cond:
            state = self._state
            if state is not None and state.status not in TERMINAL:
                state.finish(result if isinstance(result, Finished) else Finished(
                    status="failed", step=state.step, error="the trainer ended without a result"))
            job.status = state.status if state else "failed"
            job.cfg = None  # the runner keeps the snapshot, nothing of the run
            self._forget(job.id)
            self._remember({"job_id": job.id, "label": job.label, "status": job.status,
                            "output_path": state.output_path if state else None,
                            "config_path": state.config_path if state else None,
                            "state": state.last_state if state else None,
                            **(curve(state) if state else {})})
            self._current = None
            self._promote()
            self._bump()
        del sink, result
        self._release()

    def _prepare(self, job: Job) -> None:
        """Write the resolved config beside the outputs and tell the app the output folder."""
        if self.write_config:
            path = config_copy_path(job.cfg)
            try:
                config_io.save(job.cfg, path)
            except OSError as exc:
                raise RuntimeError(f"cannot write the config into {path.parent} "
                                   f"({exc.strerror or exc}); check saving.output_dir") from None
            with self._cond:
                if self._state is not None:
                    self._state.config_path = str(path.resolve())
                    self._state.note(f"config written to {path}")
                    self._bump()
        with self._cond:
            self._remember_running(job)
        if self.on_start is not None:
            self.on_start(job)

    def _release(self) -> None:
        """Free what the run left behind: garbage, then the device's cached memory."""
        gc.collect()
        try:
            from trainer.system import device

            if self._device_info is None:
                self._device_info = device.detect()
            device.empty_cache(self._device_info)
        except Exception:  # noqa: BLE001 - cleanup must never break the runner
            log.exception("emptying the device cache failed")


def _job_number(entry: dict[str, Any]) -> int:
    tail = str(entry.get("job_id", "")).rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def plain_error(exc: BaseException) -> str:
    """An exception in plain words: its message, or its kind when it has none."""
    text = str(exc).strip()
    return text if text else type(exc).__name__
