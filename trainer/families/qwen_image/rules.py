"""What a Qwen-Image config cannot ask, refused when it loads (torch-free; the config layer)."""

from __future__ import annotations

from typing import Any, Optional


def problems(cfg: Any, spec: Any, precision: Optional[str] = None) -> list[str]:
    """Qwen-Image's own refusals; ``precision`` is the run's resolved mixed precision when
    known."""
    out = []
    setting = cfg.training.mixed_precision
    if (precision or setting) == "fp16":
        chose = "" if setting == "fp16" else " (chosen for this device)"
        out.append(f"training.mixed_precision = 'fp16'{chose} cannot train {spec.label}: its "
                   f"activations overflow fp16 (ComfyUI and diffusers run it in bf16); use "
                   f"'bf16', or 'no' (fp32)")
    if cfg.mode == "lora" and cfg.network.train_text_encoder:
        out.append(f"network.train_text_encoder: a {spec.label} LoRA trains the transformer "
                   f"only (as musubi-tuner, ai-toolkit and diffusers' example do; its "
                   f"Qwen2.5-VL encoder's outputs are cached); turn it off")
    if cfg.model.fp8_text_encoders and cfg.network.train_text_encoder:
        out.append("model.fp8_text_encoders stores the frozen Qwen2.5-VL in fp8, but "
                   "network.train_text_encoder trains it; turn one of them off")
    return out
