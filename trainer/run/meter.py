"""The progress meter of a run: the moving-average loss, steps per second and the time left."""

from __future__ import annotations

from collections import deque
from typing import Optional


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
