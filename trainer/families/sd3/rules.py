"""What an SD 3.5 config cannot ask, refused when it loads (torch-free; the config layer)."""

from __future__ import annotations

from typing import Any, Optional


def problems(cfg: Any, spec: Any, precision: Optional[str] = None) -> list[str]:
    """SD 3.5's own refusals."""
    if cfg.network.train_t5xxl:
        return ["network.train_t5xxl: an SD 3.5 LoRA of T5 would load in ComfyUI but not in "
                "diffusers (its SD3 loader reads no T5 keys), so the studio does not train one; "
                "unset it"]
    return []
