"""FLUX.1's tiny twin (``embedded:tiny-flux``) and FLUX.1 Kontext's (``embedded:tiny-flux-kontext``:
the same components in ``FluxKontextPipeline``'s folder), built offline from configs with a
fixed seed."""

from __future__ import annotations

from pathlib import Path

from trainer.families.common.tiny_mmdit import build_flux_components, ensure_tiny_flow_model  # noqa: F401
from trainer.families.flux import KONTEXT


def ensure(folder: Path, name: str = "flux1") -> Path:
    return ensure_tiny_flow_model(folder, family="flux-kontext" if name == KONTEXT else "flux")
