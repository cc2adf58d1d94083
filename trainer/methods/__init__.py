"""What is trained in each mode. Methods share the one loop in trainer/loop.py.

A method injects or unfreezes what it trains (:meth:`prepare` returns the optimizer's parameter
groups), says whether the text encoder trains, and saves its result.
"""

from __future__ import annotations

from typing import Any, Protocol

from trainer.config import TrainConfig

# The modes this version can train; the GUI reads it without importing peft or torch.
AVAILABLE_MODES = ("lora",)


class MethodUnavailable(ValueError):
    """A training mode that this version cannot run yet."""


class TrainingMethod(Protocol):
    trains_text_encoder: bool

    def prepare(self, model: Any) -> list[dict[str, Any]]: ...

    def save(self, path, model: Any, facts: Any) -> Any: ...


def get_method(cfg: TrainConfig) -> TrainingMethod:
    if cfg.mode == "lora":
        from trainer.methods.lora import LoraMethod

        return LoraMethod(cfg)
    raise MethodUnavailable(
        f"mode = {cfg.mode!r}: {cfg.mode.replace('_', ' ')} training is not available yet in "
        f"this version; use mode = 'lora'"
    )
