"""The memory options that another setting rules out, refused when a config loads.

``model.base_precision`` and ``training.blocks_to_swap`` act on the *frozen* weights of the base
model; what a backend cannot run (bitsandbytes without CUDA, pinned memory without a GPU) is
only known once the device is, so :mod:`trainer.models.memory` refuses those at the run's start.
"""

from __future__ import annotations

from typing import Any


def problems(cfg: Any) -> list[str]:
    """What a memory option cannot work with, naming the setting."""
    model, tr = cfg.model, cfg.training
    if model.base_precision != "full" and cfg.mode == "dreambooth":
        return [f"model.base_precision = {model.base_precision!r}: DreamBooth trains "
                f"the base weights themselves, which stay in full precision; set it "
                f"to 'full' (or train a LoRA on the low-precision base)"]
    if tr.blocks_to_swap is None:
        return []
    if cfg.mode == "dreambooth":
        return ["training.blocks_to_swap: DreamBooth trains every block, whose "
                "weights and optimizer state the step needs on the device; unset it "
                "(or train a LoRA)"]
    if not tr.gradient_checkpointing:
        return ["training.blocks_to_swap needs training.gradient_checkpointing = "
                "true: without it autograd keeps every block's weights on the device "
                "for the backward pass, so swapping them out would save nothing"]
    return []
