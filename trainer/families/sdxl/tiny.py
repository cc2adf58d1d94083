"""SDXL's tiny twin (``embedded:tiny-sdxl``): SD's builders at SDXL's shape."""

from __future__ import annotations

from pathlib import Path

from trainer.families.sd.tiny import build_sdxl_components, ensure_tiny_model  # noqa: F401


def ensure(folder: Path, name: str = "sdxl") -> Path:
    return ensure_tiny_model(folder, family="sdxl")
