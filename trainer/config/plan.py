"""The step arithmetic: pure Python, cheap to import. The run, the importers (a warm-up given as
a percentage), the advisor and the GUI's dataset check share it, so it lives with the config."""

from __future__ import annotations

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
