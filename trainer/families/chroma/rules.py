"""What a Chroma config cannot ask, refused when it loads (torch-free; the config layer)."""

from __future__ import annotations

from typing import Any, Optional

GUIDANCE_DEFAULT = 1.0  # flow.guidance_scale's default: FLUX.1-dev's distilled guidance


def problems(cfg: Any, spec: Any, precision: Optional[str] = None) -> list[str]:
    """Chroma's own refusals; ``precision`` is the run's resolved mixed precision when known."""
    out = []
    if cfg.flow.guidance_scale != GUIDANCE_DEFAULT:
        out.append(f"flow.guidance_scale = {cfg.flow.guidance_scale:g}: {spec.label} has no "
                   f"distilled guidance input (sd-scripts trains it with 0.0, which is what "
                   f"reaches it here whatever the value); unset it. The samples' "
                   f"classifier-free guidance is sampling.sample_guidance_scale")
    setting = cfg.training.mixed_precision
    if (precision or setting) == "fp16":
        chose = "" if setting == "fp16" else " (chosen for this device)"
        out.append(f"training.mixed_precision = 'fp16'{chose} cannot train {spec.label}: its "
                   f"activations overflow fp16 as FLUX.1's do (diffusers clips its single "
                   f"blocks' outputs to fp16's range); use 'bf16', or 'no' (fp32)")
    return out
