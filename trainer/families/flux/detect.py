"""FLUX.1 from a diffusers folder (``FluxPipeline``; ``FluxKontextPipeline``: FLUX.1 Kontext)
or a single file's header: the transformer in Black Forest Labs' layout (``double_blocks.*``),
bare or under ``model.diffusion_model.``, alone or with its parts
(:mod:`trainer.families.common.mmdit_detect` reads both MMDiT layouts). A Kontext file has
FLUX.1-dev's keys, shapes and no metadata of its own (ComfyUI too loads it as FLUX.1 and adds
the reference in its conditioning), so a file reads as FLUX.1 and ``model.model_version =
"flux1_kontext"`` names Kontext. Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from trainer.families.common.mmdit_detect import FLUX_MARKER, detect_flow, holds_transformer
from trainer.families.flux import SPECS
from trainer.families.spec import Found


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    pipeline = index.get("_class_name")
    return next((s.name for s in SPECS if pipeline in s.pipelines), None)


def from_header(tensors: Mapping[str, Any]) -> Optional[Found]:
    if not holds_transformer(tensors.keys(), FLUX_MARKER):
        return None
    info = detect_flow(tensors.keys(), lambda k: tuple(tensors[k]["shape"]),
                       lambda k: tensors[k]["dtype"])
    return Found(info.version, "single file", info.description, header=info)
