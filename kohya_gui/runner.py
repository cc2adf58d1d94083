"""One training job at a time, a small queue behind it, and a state snapshot that pages poll.

The runner owns the trainer thread. ``trainer.loop.run(cfg, sink, control)`` runs on it; its
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

from trainer import config_io
from trainer.config import TrainConfig
from trainer.events import (
    Checkpoint,
    Control,
    Event,
    EventSink,
    Finished,
    Log,
    Progress,
    Sample,
    Started,
    Step,
)

log = logging.getLogger(__name__)

RunFn = Callable[[TrainConfig, EventSink, Control], Optional[Finished]]
TERMINAL = ("finished", "stopped", "failed")
SMOOTHING = 0.9  # weight of the past in the smoothed loss (TensorBoard's default is 0.6-0.9)


def default_run(cfg: TrainConfig, sink: EventSink, control: Control) -> Finished:
    from trainer.loop import run

    return run(cfg, sink, control)


def smooth(prev: float, value: float, n: int, beta: float = SMOOTHING) -> tuple[float, float]:
    """One step of a bias-corrected exponential moving average (Kingma & Ba 2015, sec. 3):
    returns (new biased average, corrected value); ``n`` counts values so far, this one
    included."""
    biased = beta * prev + (1 - beta) * value
    return biased, biased / (1 - beta ** n)


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


class JobState:
    """What the page shows of one job, built from its events."""

    def __init__(self, job: Job, log_lines: int = 200):
        self.job_id, self.label = job.id, job.label
        self.status = "running"
        self.step = self.total = self.epoch = self.epochs = 0
        self.loss: list[tuple[int, float]] = []
        self.smoothed: list[tuple[int, float]] = []
        self._ema, self._n = 0.0, 0
        self.lr: float | None = None
        self.it_per_s: float | None = None
        self.eta_s: float | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self.output_path: str | None = None
        self.error: str | None = None
        self.config_path: str | None = None
        self.output_dir = str(Path(job.cfg.saving.output_dir).expanduser().resolve())
        self.samples: list[dict[str, Any]] = []
        self.checkpoints: list[str] = []
        self.started: dict[str, Any] = {}
        self.preparing: dict[str, Any] | None = None  # the latest Progress until Started
        self._progress_noted: tuple[str, int] | None = None  # (stage, tenth) last logged
        self.stop_requested = False
        self.started_at, self.ended_at = time.time(), None

    def note(self, message: str, when: float | None = None) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(when or time.time()))
        self.log.append(f"{stamp} {message}")

    def apply(self, event: Event) -> None:
        if isinstance(event, Step):
            self._step(event)
        elif isinstance(event, Log):
            prefix = "" if event.level == "info" else f"[{event.level}] "
            self.note(prefix + event.message, event.time)
        elif isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, Started):
            self._started(event)
        elif isinstance(event, Sample):
            self.samples.append({"step": event.step, "paths": list(event.paths),
                                 "prompts": list(event.prompts)})
        elif isinstance(event, Checkpoint):  # the trainer's own log line says it was saved
            self.checkpoints.append(event.path)
        elif isinstance(event, Finished):
            self.finish(event)

    def _progress(self, event: Progress) -> None:
        """Keep the latest; log a line when a stage starts, at each tenth and at its end
        (a few lines, not one per event)."""
        self.preparing = {"stage": event.stage, "done": event.done, "total": event.total}
        tenth = 10 * event.done // event.total if event.total > 0 else 0
        last = self._progress_noted
        if (last is None or last[0] != event.stage or tenth > last[1]
                or event.done >= event.total):
            self._progress_noted = (event.stage, tenth)
            self.note(f"{event.stage}: {event.done}/{event.total}")

    def _started(self, event: Started) -> None:
        self.preparing = None
        self.started = {k: getattr(event, k) for k in event.__dataclass_fields__}
        self.total, self.epochs = event.total_steps, event.epochs
        self.note(f"training {event.total_steps} steps ({event.epochs} epochs x "
                  f"{event.steps_per_epoch}) on {event.device}, precision "
                  f"{event.mixed_precision}")

    def _step(self, event: Step) -> None:
        self.step, self.total, self.epoch = event.step, event.total_steps, event.epoch
        self.lr, self.it_per_s, self.eta_s = event.lr, event.it_per_s, event.eta_s
        self._n += 1
        self._ema, value = smooth(self._ema, event.loss, self._n)
        self.loss.append((event.step, event.loss))
        self.smoothed.append((event.step, value))

    def finish(self, event: Finished) -> None:
        if self.status in TERMINAL:
            return
        self.status, self.ended_at = event.status, time.time()
        self.step = max(self.step, event.step)
        self.output_path, self.error = event.output_path, event.error
        if event.status == "failed":
            self.note(f"failed: {event.error or 'no reason given'}")
        else:
            self.note(f"{event.status} at step {event.step}"
                      + (f": {event.output_path}" if event.output_path else ""))

    def to_dict(self) -> dict[str, Any]:
        end = self.ended_at or time.time()
        return {
            "job_id": self.job_id, "label": self.label, "status": self.status,
            "step": self.step, "total": self.total, "epoch": self.epoch, "epochs": self.epochs,
            "loss": [list(p) for p in self.loss], "smoothed": [list(p) for p in self.smoothed],
            "lr": self.lr, "it_per_s": self.it_per_s, "eta_s": self.eta_s,
            "log": list(self.log), "output_path": self.output_path, "error": self.error,
            "config_path": self.config_path, "output_dir": self.output_dir,
            "samples": [dict(s) for s in self.samples], "checkpoints": list(self.checkpoints),
            "started": dict(self.started), "stop_requested": self.stop_requested,
            "preparing": dict(self.preparing) if self.preparing else None,
            "elapsed_s": round(end - self.started_at, 1),
        }


class QueueSink:
    """The EventSink of one job: folds its events into the runner's state, under its lock."""

    def __init__(self, runner: Runner, job: Job):
        self._runner, self._job = runner, job

    def emit(self, event: Event) -> None:
        self._runner._apply(self._job, event)


IDLE = {"status": "idle", "job_id": None, "label": None, "step": 0, "total": 0, "epoch": 0,
        "epochs": 0, "loss": [], "smoothed": [], "lr": None, "it_per_s": None, "eta_s": None,
        "log": [], "output_path": None, "error": None, "config_path": None, "output_dir": None,
        "samples": [], "checkpoints": [], "started": {}, "stop_requested": False,
        "preparing": None, "elapsed_s": 0.0}


class QueueFull(RuntimeError):
    pass


class Runner:
    """Runs queued jobs one at a time on its own thread; everything else reads snapshots."""

    def __init__(self, run_fn: RunFn | None = None, *, max_queue: int = 8,
                 write_config: bool = True, on_start: Callable[[Job], None] | None = None,
                 device_info: Any = None, log_lines: int = 200):
        self._run_fn = run_fn or default_run
        self.max_queue, self.write_config, self.on_start = max_queue, write_config, on_start
        self._device_info, self._log_lines = device_info, log_lines
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._current: Job | None = None
        self._next: Job | None = None  # promoted, for the trainer thread to pick up
        self._state: JobState | None = None
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
        self._ids = itertools.count(1)
        self._version = 0
        self._closed = False
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
                    self._history.appendleft({"job_id": job.id, "label": job.label,
                                              "status": "cancelled", "output_path": None})
                    self._bump()
                    return f"{job_id} cancelled"
            if self._current is not None and self._current.id == job_id:
                return f"{job_id} is running; use Stop to end it"
        return f"{job_id} is not in the queue"

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
        """Stop the running job, drop the queue and end the thread."""
        with self._cond:
            self._queue.clear()
            self._closed = True
            if self._current is not None:
                self._current.control.request_stop()
            self._cond.notify_all()

    # --- the trainer thread ---

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _apply(self, job: Job, event: Event) -> None:
        with self._cond:
            if self._state is not None and self._state.job_id == job.id:
                self._state.apply(event)
                self._bump()

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
            self._history.appendleft({"job_id": job.id, "label": job.label,
                                      "status": job.status,
                                      "output_path": state.output_path if state else None})
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
        if self.on_start is not None:
            self.on_start(job)

    def _release(self) -> None:
        """Free what the run left behind: garbage, then the device's cached memory."""
        gc.collect()
        try:
            from trainer import device

            if self._device_info is None:
                self._device_info = device.detect()
            device.empty_cache(self._device_info)
        except Exception:  # noqa: BLE001 - cleanup must never break the runner
            log.exception("emptying the device cache failed")


def plain_error(exc: BaseException) -> str:
    """An exception in plain words: its message, or its kind when it has none."""
    text = str(exc).strip()
    return text if text else type(exc).__name__
