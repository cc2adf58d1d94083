"""FLUX.1's tiny twin (``embedded:tiny-flux``), built offline from configs with a fixed seed."""

from __future__ import annotations

from pathlib import Path

from trainer.families.common.tiny_mmdit import build_flux_components, ensure_tiny_flow_model  # noqa: F401


def ensure(folder: Path, name: str = "flux1") -> Path:
    return ensure_tiny_flow_model(folder, family="flux")
