"""What a Z-Image config cannot ask, refused when it loads (torch-free; the config layer)."""

from __future__ import annotations

from typing import Any, Optional


def problems(cfg: Any, spec: Any, precision: Optional[str] = None) -> list[str]:
    """Z-Image's own refusals: its LoRA trains the transformer only (as musubi-tuner's and
    diffusers' example do), so the LoRA file holds no Qwen3 layers."""
    if cfg.mode == "lora" and cfg.network.train_text_encoder:
        return [f"network.train_text_encoder = true: a {spec.label} LoRA trains the transformer "
                f"only (as musubi-tuner and diffusers' example; ComfyUI and diffusers read no "
                f"Qwen3 LoRA of it); turn it off, or train the text encoder with DreamBooth"]
    return []
