"""The model families: one folder each, listed here once.

``FAMILIES`` is the registry (a family's folder declares its :class:`~trainer.families.spec.
FamilySpec`; adding a family is its folder and its line in ``_FOLDERS``). Everything here is
torch-free: :func:`spec` answers what a family is, :func:`detect_path` which family a path holds
(from a diffusers folder's ``model_index.json`` or a ``.safetensors`` header, never a weight),
and :func:`family` / :func:`role` import a family's roles (its ``conditioning``, ``lora``,
``checkpoint``, ... modules) only when they are asked for. ``trainer/families/README.md`` walks
through adding a family.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from trainer.families import chroma, flux, flux2, qwen_image, sd, sd3, sdxl, zimage
from trainer.families.spec import DetectionError, FamilySpec, Found, ModelLoadError

__all__ = ["FAMILIES", "LAST_RESORT", "DetectionError", "FamilySpec", "Found", "ModelLoadError",
           "detect_path", "embedded_family", "family", "family_of", "family_or_none",
           "folder_family", "is_flow", "label", "model_versions", "names", "role", "spec",
           "version_family", "version_variant"]

# The family folders, one line each; a single file is offered to each folder's detect role in
# the order of _DETECTION (the transformer layouts first; the UNet families' detection, last,
# names what a file is when it is none of them).
# (flux2 before flux: the advisor tells a transformer's family by its class name's prefix,
# and FLUX.1's "Flux" would claim Flux2Transformer2DModel)
_FOLDERS = (sd, sdxl, flux2, flux, sd3, chroma, qwen_image, zimage)
FAMILIES: dict[str, FamilySpec] = {s.name: s for m in _FOLDERS for s in m.SPECS}
# the values of model.model_version that name a variant rather than a family (Variant.version:
# Qwen-Image-Edit's "qwen_image_edit", whose single file has Qwen-Image's keys) -> (family,
# variant); every function here that takes a family name takes these too
VERSIONS: dict[str, tuple[str, str]] = {v.version: (s.name, v.name) for s in FAMILIES.values()
                                        for v in s.variants if v.version}
# Chroma first (FLUX.1's layout, other blocks); FLUX.2 shares FLUX.1's double_blocks
_DETECTION = ("chroma", "flux2", "flux", "sd3", "qwen_image", "zimage", "sd")
# the family whose load role opens what detection cannot tell (a .ckpt, a folder of no known
# pipeline): SD's single-file and folder loads name what such a path holds
LAST_RESORT = "sd1"  # sd's detection answers for SDXL too


def spec(name: str) -> FamilySpec:
    """The family named ``name`` (a value of ``model.model_version``: a family, or a variant's
    :data:`VERSIONS` name, whose family it is)."""
    try:
        return FAMILIES[version_family(name)]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def version_family(value: str) -> str:
    """The family a value of ``model.model_version`` names (``qwen_image_edit`` ->
    ``qwen_image``); a family's name, ``auto`` or an unknown value as it is."""
    return VERSIONS[value][0] if value in VERSIONS else value


def version_variant(value: str) -> Optional[str]:
    """The variant a value of ``model.model_version`` names (``qwen_image_edit`` -> ``edit``);
    None for a family's name or ``auto``: the model tells its own."""
    return VERSIONS[value][1] if value in VERSIONS else None


def model_versions() -> tuple[str, ...]:
    """Every value of ``model.model_version`` but ``auto``: the families, then the variants
    that only the setting can name."""
    return names() + tuple(VERSIONS)


def names(objective: Optional[str] = None, denoiser: Optional[str] = None) -> tuple[str, ...]:
    """The family names, optionally those of one objective (``ddpm`` / ``flow``) or denoiser
    (``unet`` / ``transformer``), in the registry's order (the schema's ``model_version``)."""
    return tuple(s.name for s in FAMILIES.values() if objective in (None, s.objective)
                 and denoiser in (None, s.denoiser))


def label(name: str) -> str:
    """What people read for a family, or for a variant's :data:`VERSIONS` name its variant's
    label (``Qwen-Image-Edit-2509``)."""
    if name in VERSIONS:
        return spec(name).variant(VERSIONS[name][1]).label
    return spec(name).label


def is_flow(name: Optional[str]) -> bool:
    """Whether ``name`` is a family that trains with flow matching."""
    name = version_family(name) if name else name
    return name in FAMILIES and FAMILIES[name].objective == "flow"


def embedded_family(path: Optional[str]) -> Optional[str]:
    """The family of an embedded tiny twin's id (``embedded:tiny-flux``), else None."""
    return next((s.name for s in FAMILIES.values() if path in s.twins), None)


def role(name: str, role_name: str) -> Optional[ModuleType]:
    """A role module of a family (``conditioning``, ``lora``, ``rules``, ...), imported on first
    use; None where the family's folder has no such role."""
    module = f"trainer.families.{spec(name).folder}.{role_name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def family(name: str, guidance: Optional[float] = None) -> Any:
    """The family object of ``name`` (its conditioning role's ``family(name)``): the text
    encoders, prompt encoding, the denoiser call and the sample pipeline; ``guidance``: the
    distilled guidance a guidance-distilled transformer reads (``flow.guidance_scale``)."""
    return role(name, "conditioning").family(name, guidance=guidance)


def family_of(model: Any) -> Any:
    """The family object of a loaded model (``model.version``)."""
    return family(model.version)


def _json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_family(folder: Path) -> Optional[str]:
    """The family of a diffusers folder from its JSON files; None without a
    ``model_index.json`` of a known pipeline."""
    index = _json(Path(folder) / "model_index.json")
    if index is None:
        return None
    for module in _DETECTION:
        found = _detector(module).from_folder(Path(folder), index)
        if found is not None:
            return found
    return None


def _detector(folder: str) -> ModuleType:
    return importlib.import_module(f"trainer.families.{folder}.detect")


def file_family(path: Path) -> Found:
    """What a ``.safetensors`` file holds, from its header; raises ``ModelFileError`` for a
    file that is not a readable safetensors file and ``DetectionError`` for one that holds no
    base model of a known family (each names what it is instead)."""
    from trainer.families.common.files import read_safetensors_header

    tensors = read_safetensors_header(path).tensors
    for module in _DETECTION:
        found = _detector(module).from_header(tensors)
        if found is not None:
            return found
    raise DetectionError("it holds no base model of a known family")


def detect_path(path: str | Path) -> Found:
    """The family of a base model's path; raises ``DetectionError`` (a ``ModelLoadError``)
    saying why it cannot tell, and ``ModelFileError`` for a damaged file."""
    path = Path(path).expanduser()
    if path.is_dir():
        name = folder_family(path)
        if name is None:
            known = ", ".join(dict.fromkeys(s.label for s in FAMILIES.values()))
            raise DetectionError(f"the folder has no model_index.json of a known pipeline "
                                 f"({known})")
        return Found(name, "diffusers folder", f"{label(name)} (diffusers folder)")
    if path.suffix.lower() == ".safetensors":
        return file_family(path)
    if path.suffix.lower() == ".ckpt":
        raise DetectionError("a .ckpt file is a pickle whose keys only torch can read; its "
                             "family is read when it loads")
    raise DetectionError("not a diffusers folder nor a .safetensors/.ckpt file")


def family_or_none(path: str | Path) -> Optional[str]:
    """:func:`detect_path`'s family, or None where it cannot tell (a path that does not exist
    yet, a .ckpt, a damaged file): for the callers that then show or assume everything."""
    from trainer.families.common.files import ModelFileError

    try:
        return detect_path(path).family
    except (DetectionError, ModelFileError, OSError):
        return None
