"""Which family a base model path holds, without torch and without reading a weight: the one
detection that the loader, the advisor, the GUI's field hiding and the doctor share.

- a diffusers folder: ``model_index.json``'s ``_class_name`` (FluxPipeline, StableDiffusion3-,
  StableDiffusionXL-, StableDiffusionPipeline), SD 2.x by its text encoder (1024 wide, GELU);
- a ``.safetensors`` file: its checked header (:mod:`trainer.models.file_checks`): FLUX.1 /
  SD 3.x in BFL's or Stability's layout (:mod:`trainer.models.flow_families`: a transformer
  alone or a ComfyUI all-in-one file, which parts it holds), else the UNet families by their
  key names and shapes (:mod:`trainer.models.families`).

A ``.ckpt`` is a pickle that only torch can open: its family is known once it is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.models.families import FAMILIES, DetectionError

PIPELINE_FAMILIES = {"FluxPipeline": "flux1", "StableDiffusion3Pipeline": "sd3",
                     "StableDiffusionXLPipeline": "sdxl", "StableDiffusionPipeline": "sd1"}
FLOW_LABELS = {"flux1": "FLUX.1", "sd3": "SD 3.x"}


@dataclass(frozen=True)
class Found:
    """What a path holds: ``family`` is a value of ``model.model_version`` (sd1, sd2, sdxl,
    flux1, sd3); ``flow`` the header's facts of a FLUX.1 / SD 3.x file (parts inside, variant,
    shapes); ``unet`` those of a UNet family's single file."""

    family: str
    layout: str  # "diffusers folder" or "single file"
    description: str
    flow: Any = None  # trainer.models.flow_families.FlowFileInfo
    unet: Any = None  # trainer.models.families.Detected

    @property
    def is_flow(self) -> bool:
        return is_flow(self.family)


def is_flow(family: Optional[str]) -> bool:
    """Whether ``family`` is one of the flow transformers' (FLUX.1, SD 3.x)."""
    return family in FLOW_LABELS


def _json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_family(folder: Path) -> Optional[str]:
    """The family of a diffusers folder from its JSON files; None without a
    ``model_index.json`` of a known pipeline."""
    index = _json(folder / "model_index.json")
    if index is None:
        return None
    family = PIPELINE_FAMILIES.get(str(index.get("_class_name")))
    if family is None and "unet" in index:  # another SD pipeline class of the same parts
        family = "sdxl" if "text_encoder_2" in index else "sd1"
    if family == "sd1":  # SD 1.x and 2.x share the pipeline; SD 2's OpenCLIP is 1024 wide, GELU
        encoder = _json(folder / "text_encoder" / "config.json") or {}
        if encoder.get("hidden_size") == 1024 or encoder.get("hidden_act") == "gelu":
            family = "sd2"
    return family


def file_family(path: Path) -> Found:
    """What a ``.safetensors`` file holds, from its header; raises ``ModelFileError`` for a
    file that is not a readable safetensors file and ``DetectionError`` for one that holds no
    base model of a known family (each names what it is instead)."""
    from trainer.models import families
    from trainer.models.file_checks import read_safetensors_header
    from trainer.models.flow_families import detect_flow, is_flow_file

    tensors = read_safetensors_header(path).tensors
    if is_flow_file(tensors):
        info = detect_flow(tensors.keys(), lambda k: tuple(tensors[k]["shape"]),
                           lambda k: tensors[k]["dtype"])
        return Found(info.version, "single file", info.description, flow=info)
    try:
        found = families.detect(set(tensors), lambda k: tuple(tensors[k]["shape"]))
    except (KeyError, TypeError, IndexError) as exc:
        raise DetectionError(f"its header is not a checkpoint's ({exc})") from None
    return Found(found.family.name, "single file", found.family.label, unet=found)


def detect_path(path: str | Path) -> Found:
    """The family of a base model's path (see the module's notes); raises ``DetectionError``
    (a ``ModelLoadError``) saying why it cannot tell, and ``ModelFileError`` for a damaged
    file."""
    path = Path(path).expanduser()
    if path.is_dir():
        family = folder_family(path)
        if family is None:
            raise DetectionError("the folder has no model_index.json of a Stable Diffusion, "
                                 "SDXL, FLUX.1 or SD 3.x pipeline")
        label = FLOW_LABELS.get(family) or FAMILIES[family].label
        return Found(family, "diffusers folder", f"{label} (diffusers folder)")
    if path.suffix.lower() == ".safetensors":
        return file_family(path)
    if path.suffix.lower() == ".ckpt":
        raise DetectionError("a .ckpt file is a pickle whose keys only torch can read; its "
                             "family is read when it loads")
    raise DetectionError("not a diffusers folder nor a .safetensors/.ckpt file")


def family_or_none(path: str | Path) -> Optional[str]:
    """:func:`detect_path`'s family, or None where it cannot tell (a path that does not exist
    yet, a .ckpt, a damaged file): for the callers that then show or assume everything."""
    from trainer.models.file_checks import ModelFileError

    try:
        return detect_path(path).family
    except (DetectionError, ModelFileError, OSError):
        return None
