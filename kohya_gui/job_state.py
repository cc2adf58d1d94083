"""What the page shows of one job, folded from its events: the runner's state snapshot.

:class:`JobState` keeps the step, the loss points (raw and smoothed), the validation loss
points, the log tail, samples, checkpoints and the outcome; :meth:`JobState.to_dict` is the
JSON-ready snapshot the page polls. :func:`curve` is what the job history keeps of a finished
run, so that the chart can draw it beside another one.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

from trainer.events import (
    Checkpoint,
    Event,
    Finished,
    Log,
    Progress,
    Sample,
    Started,
    Step,
    Validation,
)
from trainer.optim.lr import lr_label

TERMINAL = ("finished", "stopped", "failed")
SMOOTHING = 0.9  # weight of the past in the smoothed loss (TensorBoard's default is 0.6-0.9)
CURVE_POINTS = 300  # per series, in the job history
LOG_LINE_CHARS = 2_000  # one log line; longer ones end in "..."
KEPT_POINTS = 2_000  # per series while a run goes: past that, every other old point is dropped
SENT_POINTS = 400  # per series in a snapshot (a page draws progress.MAX_POINTS of them)
SAMPLES_KEPT = 50  # sample sets and checkpoint paths kept (the page shows the newest 8)


def smooth(prev: float, value: float, n: int, beta: float = SMOOTHING) -> tuple[float, float]:
    """One step of a bias-corrected exponential moving average (Kingma & Ba 2015, sec. 3):
    returns (new biased average, corrected value); ``n`` counts values so far, this one
    included."""
    biased = beta * prev + (1 - beta) * value
    return biased, biased / (1 - beta ** n)


class JobState:
    """What the page shows of one job, built from its events."""

    def __init__(self, job: Any, log_lines: int = 200):
        self.job_id, self.label = job.id, job.label
        self.status = "running"
        self.step = self.total = self.epoch = self.epochs = 0
        self.loss: list[tuple[int, float]] = []
        self.smoothed: list[tuple[int, float]] = []
        self.validation: list[tuple[int, float]] = []
        self._ema, self._n = 0.0, 0
        self.lr: float | None = None
        self.lr_label = lr_label(job.cfg.optimizer)  # "effective ..." for adaptive optimizers
        self.it_per_s: float | None = None
        self.eta_s: float | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self.output_path: str | None = None
        self.error: str | None = None
        self.config_path: str | None = None
        self.output_dir = str(Path(job.cfg.saving.output_dir).expanduser().resolve())
        self.samples: list[dict[str, Any]] = []
        self.checkpoints: list[str] = []
        self.last_state: str | None = None  # the newest training state saved (resumable)
        self.started: dict[str, Any] = {}
        self.preparing: dict[str, Any] | None = None  # the latest Progress until Started
        self._progress_noted: tuple[str, int] | None = None  # (stage, tenth) last logged
        self.stop_requested = False
        self.started_at, self.ended_at = time.time(), None

    def note(self, message: str, when: float | None = None) -> None:
        if len(message) > LOG_LINE_CHARS:  # the log is bounded in lines and in line length
            message = message[: LOG_LINE_CHARS - 3] + "..."
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
        elif isinstance(event, Validation):  # the trainer's own log line says it too
            keep(self.validation, (event.step, event.loss))
        elif isinstance(event, Sample):
            self.samples.append({"step": event.step, "paths": list(event.paths),
                                 "prompts": list(event.prompts),
                                 "controls": [list(c) for c in event.controls]})
            del self.samples[:-SAMPLES_KEPT]
        elif isinstance(event, Checkpoint):  # the trainer's own log line says it was saved
            self.checkpoints.append(event.path)
            del self.checkpoints[:-SAMPLES_KEPT]
            self.last_state = event.state or self.last_state
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
        keep(self.loss, (event.step, event.loss))
        keep(self.smoothed, (event.step, value))

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
            "loss": thin(self.loss, SENT_POINTS), "smoothed": thin(self.smoothed, SENT_POINTS),
            "validation": thin(self.validation, SENT_POINTS),
            "lr": self.lr, "lr_label": self.lr_label, "it_per_s": self.it_per_s,
            "eta_s": self.eta_s, "log": list(self.log), "output_path": self.output_path,
            "error": self.error,
            "config_path": self.config_path, "output_dir": self.output_dir,
            "samples": [dict(s) for s in self.samples], "checkpoints": list(self.checkpoints),
            "started": dict(self.started), "stop_requested": self.stop_requested,
            "preparing": dict(self.preparing) if self.preparing else None,
            "elapsed_s": round(end - self.started_at, 1),
        }


IDLE = {"status": "idle", "job_id": None, "label": None, "step": 0, "total": 0, "epoch": 0,
        "epochs": 0, "loss": [], "smoothed": [], "validation": [], "lr": None,
        "lr_label": "learning rate", "it_per_s": None, "eta_s": None,
        "log": [], "output_path": None, "error": None, "config_path": None, "output_dir": None,
        "samples": [], "checkpoints": [], "started": {}, "stop_requested": False,
        "preparing": None, "elapsed_s": 0.0}


def keep(series: list, point: tuple, limit: int = KEPT_POINTS) -> None:
    """Append ``point``; a series over ``limit`` points loses every other point but the newest
    (memory stays bounded however long the run; the curve keeps its shape)."""
    series.append(point)
    if len(series) > limit:
        series[:] = series[:-1:2] + [series[-1]]


def thin(points: list, limit: int) -> list:
    """At most ``limit`` points, evenly spaced, the last one always kept."""
    if len(points) <= limit:
        return [list(p) for p in points]
    stride = len(points) / limit
    return [list(points[int(i * stride)]) for i in range(limit - 1)] + [list(points[-1])]


def curve(state: JobState) -> dict[str, list]:
    """What the job history keeps of a run's chart: its smoothed and validation losses."""
    return {"smoothed": thin(state.smoothed, CURVE_POINTS),
            "validation": thin(state.validation, CURVE_POINTS)}
