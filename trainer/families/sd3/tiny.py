"""SD 3.5's tiny twin (``embedded:tiny-sd3``), built offline from configs with a fixed seed."""

from __future__ import annotations

from pathlib import Path

from trainer.families.common.tiny_mmdit import build_sd3_components, ensure_tiny_flow_model  # noqa: F401


def ensure(folder: Path, name: str = "sd3") -> Path:
    return ensure_tiny_flow_model(folder, family="sd3")
