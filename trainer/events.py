"""How the trainer talks to the outside: typed events out, a Control in.

``run(cfg, sink, control)`` emits events to an :class:`EventSink` (the CLI prints them; the GUI's
runner folds them into a state snapshot) and reads requests from :class:`Control` at step
boundaries. A sink that raises never kills a run: :func:`safe_emit` logs and carries on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Protocol, Union

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Log:
    """A line of the run's log."""

    message: str
    level: str = "info"
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Started:
    """Training begins; carries the step arithmetic and the bucket table."""

    total_steps: int
    epochs: int
    steps_per_epoch: int
    num_images: int
    num_repeated_images: int
    batch_size: int
    gradient_accumulation_steps: int
    buckets: dict[str, int]  # "WxH" -> images (with repeats)
    device: str
    mixed_precision: str
    output_dir: str


@dataclass(frozen=True)
class Progress:
    """Work before training that takes a while (e.g. generating class images): done of total."""

    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class Step:
    step: int
    total_steps: int
    epoch: int
    loss: float
    loss_avg: float
    lr: float
    it_per_s: float
    eta_s: Optional[float]


@dataclass(frozen=True)
class Validation:
    """The loss on the validation images at fixed timesteps and fixed noise, so that it
    compares from step to step (trainer/run/validation.py)."""

    step: int
    loss: float
    images: int


@dataclass(frozen=True)
class Sample:
    step: int
    paths: tuple[str, ...]
    prompts: tuple[str, ...]
    # an edit model's control images of each prompt (its --ci paths as the pipeline took
    # them), in the order of ``paths``; () when no prompt has one
    controls: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    step: int
    epoch: int
    path: str
    state: Optional[str] = None  # the training state folder saved with it (saving.save_state)


@dataclass(frozen=True)
class Finished:
    """The end of a run: status is finished, stopped or failed."""

    status: str
    step: int
    output_path: Optional[str] = None
    error: Optional[str] = None


Event = Union[Log, Progress, Started, Step, Validation, Sample, Checkpoint, Finished]


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...


class NullSink:
    def emit(self, event: Event) -> None:
        pass


class ListSink:
    """Keeps every event; for tests and scripts."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def safe_emit(sink: EventSink, event: Event) -> None:
    """Deliver an event; a failing sink is logged, never fatal to the run."""
    try:
        sink.emit(event)
    except Exception:  # noqa: BLE001 - a broken UI must not end a training run
        log.exception("event sink failed on %s", type(event).__name__)


class Control:
    """Requests from the UI, read by the trainer at step boundaries (thread-safe)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._sample = threading.Event()
        self._save = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def request_sample(self) -> None:
        self._sample.set()

    def request_save(self) -> None:
        self._save.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def take_sample_request(self) -> bool:
        hit = self._sample.is_set()
        self._sample.clear()
        return hit

    def take_save_request(self) -> bool:
        hit = self._save.is_set()
        self._save.clear()
        return hit
