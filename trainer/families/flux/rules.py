"""What a FLUX.1 config cannot ask, refused when it loads (torch-free; the config layer)."""

from __future__ import annotations

from typing import Any, Optional


def problems(cfg: Any, spec: Any, precision: Optional[str] = None) -> list[str]:
    """FLUX.1's own refusals; ``precision`` is the run's resolved mixed precision when known."""
    setting = cfg.training.mixed_precision
    if (precision or setting) != "fp16":
        return []
    chose = "" if setting == "fp16" else " (chosen for this device)"
    return [f"training.mixed_precision = 'fp16'{chose} cannot train {spec.label}: its "
            f"activations overflow fp16 (NaN losses or an empty LoRA, as sd-scripts' users "
            f"report); use 'bf16', or 'no' (fp32)"]
