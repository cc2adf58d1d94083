"""SD 3 and 3.5 from a diffusers folder (``StableDiffusion3Pipeline``) or a single file's header:
the transformer in Stability's layout (``joint_blocks.*``) under ``model.diffusion_model.``, alone
or with its parts (:mod:`trainer.families.common.mmdit_detect` reads both MMDiT layouts).
Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from trainer.families.common.mmdit_detect import SD3_MARKER, detect_flow, holds_transformer
from trainer.families.spec import Found


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    return "sd3" if index.get("_class_name") == "StableDiffusion3Pipeline" else None


def from_header(tensors: Mapping[str, Any]) -> Optional[Found]:
    if not holds_transformer(tensors.keys(), SD3_MARKER):
        return None
    info = detect_flow(tensors.keys(), lambda k: tuple(tensors[k]["shape"]),
                       lambda k: tensors[k]["dtype"])
    return Found(info.version, "single file", info.description, header=info)
