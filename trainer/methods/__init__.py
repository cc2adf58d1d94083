"""What is trained in each mode. Methods share the one loop in trainer/run/loop.py.

A method decides what trains and how it is saved, and nothing else:

- :meth:`prepare` freezes the base model, injects or unfreezes what trains, and returns the
  optimizer's parameter groups;
- ``trains_text_encoder`` says whether the text encoder's forward pass needs gradients (the
  loop's step reads it through ``model.text_encoder.training``);
- :meth:`after_step` runs after every optimizer step (textual inversion puts back the rows of
  the embedding matrix that must not change; LoRA and DreamBooth freeze the text encoder after
  ``network.stop_text_encoder_training`` steps) and may return a line for the log;
- :meth:`save` writes the result at ``path`` (``<output_name><suffix>.safetensors``), whose
  resolved config the loop writes beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol

from trainer.config import TrainConfig

# The modes this version can train; the GUI reads it without importing peft or torch.
AVAILABLE_MODES = ("lora", "dreambooth", "textual_inversion")


class MethodUnavailable(ValueError):
    """A training mode that this version cannot run."""


class TrainingMethod(Protocol):
    trains_text_encoder: bool
    trains_t5: bool  # FLUX.1 / SD 3.5's T5 (its fp8 storage may then not begin at the load)

    def prepare(self, model: Any) -> list[dict[str, Any]]: ...

    def after_step(self, model: Any, step: int) -> Optional[str]: ...

    def save(self, path: Path, model: Any, facts: Any, final: bool) -> Path: ...


def get_method(cfg: TrainConfig) -> TrainingMethod:
    if cfg.mode == "lora" and cfg.network.network_type != "lora":
        from trainer.methods.lycoris import LycorisMethod  # LoCon, LoHa, LoKr, IA3, DoRA

        return LycorisMethod(cfg)
    if cfg.mode == "lora" and cfg.network.dylora_unit is not None:
        from trainer.methods.dylora import DyLoraMethod  # sd-scripts' networks.dylora

        return DyLoraMethod(cfg)
    if cfg.mode == "lora":
        from trainer.methods.lora import LoraMethod

        return LoraMethod(cfg)
    if cfg.mode == "dreambooth":
        from trainer.methods.dreambooth import DreamBoothMethod

        return DreamBoothMethod(cfg)
    if cfg.mode == "textual_inversion":
        from trainer.methods.textual_inversion import TextualInversionMethod

        return TextualInversionMethod(cfg)
    raise MethodUnavailable(f"mode = {cfg.mode!r}: not a training mode of this version; use one "
                            f"of {', '.join(AVAILABLE_MODES)}")
