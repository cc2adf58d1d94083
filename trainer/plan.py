"""The step arithmetic and the progress meter: pure Python, cheap to import (the GUI uses it)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class StepPlan:
    """The step arithmetic: images x repeats / batch -> batches; / accumulation -> steps."""

    batches_per_epoch: int
    steps_per_epoch: int
    total_steps: int
    epochs: int


def plan_steps(batches_per_epoch: int, accumulation: int, max_steps: Optional[int],
               max_epochs: Optional[int]) -> StepPlan:
    if batches_per_epoch < 1:
        raise ValueError("the dataset gives no batch: add images or lower the batch size")
    per_epoch = max(1, -(-batches_per_epoch // accumulation))
    if max_steps is None:
        epochs = max_epochs or 1
        total = epochs * per_epoch
    else:
        total = max_steps if max_epochs is None else min(max_steps, max_epochs * per_epoch)
        epochs = -(-total // per_epoch)
    return StepPlan(batches_per_epoch, per_epoch, total, epochs)


class Meter:
    """Moving-average loss, steps per second and the time left."""

    def __init__(self, window: int = 20):
        self.losses: deque[float] = deque(maxlen=window)
        self.times: deque[float] = deque(maxlen=window + 1)

    def update(self, loss: float, now: float) -> None:
        self.losses.append(loss)
        self.times.append(now)

    @property
    def loss_avg(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")

    @property
    def it_per_s(self) -> float:
        if len(self.times) < 2:
            return 0.0
        span = self.times[-1] - self.times[0]
        return (len(self.times) - 1) / span if span > 0 else 0.0

    def eta(self, remaining_steps: int) -> Optional[float]:
        rate = self.it_per_s
        return remaining_steps / rate if rate > 0 else None
