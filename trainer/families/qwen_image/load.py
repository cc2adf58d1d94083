"""Qwen-Image as the loader reads it: a diffusers folder (``QwenImagePipeline``, through
diffusers' own ``from_pretrained``), or the split files as ComfyUI users download them
(:mod:`trainer.families.qwen_image.single_file`). Each function returns the fields of
:class:`trainer.models.loader.BaseModel`. An edit variant's folder (Edit, 2509, 2511) loads with
its processor (:mod:`trainer.families.qwen_image.edit`); a single file with the processor
looked up as its tokenizer is (ComfyUI's files hold none); Edit and 2509 files have the base
model's keys, so ``model.model_version`` names them (ComfyUI tells them apart by the workflow,
not the file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.families import version_variant
from trainer.families.qwen_image.detect import LABELS, folder_variant
from trainer.families.qwen_image.edit import PIPELINES, is_edit, load_processor
from trainer.families.qwen_image.single_file import check_version, refuse_variant
from trainer.families.spec import ModelLoadError

FIELD = "model.pretrained_model_name_or_path"


def load_folder(path: Path, section: Any, name: str = "qwen_image") -> dict[str, Any]:
    """The BaseModel fields of a Qwen-Image diffusers folder."""
    import diffusers

    index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    config_file = path / "transformer" / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    variant = folder_variant(index, config)
    check_version(path, section, f"a {LABELS[variant]} pipeline")
    named = version_variant(section.model_version)
    if named not in (None, variant):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r} ({LABELS[named]}), but the folder "
                             f"holds a {LABELS[variant]} pipeline; set it to 'auto' or "
                             f"'qwen_image'")
    if not is_edit(variant):
        refuse_variant(path, variant)
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a Qwen-Image folder, whose VAE "
                             f"is its own; unset model.vae")
    try:
        pipeline = getattr(diffusers, PIPELINES.get(variant, "QwenImagePipeline"))
        parts = pipeline.from_pretrained(
            path, local_files_only=True, **_processor(path, variant)).components
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot load the diffusers folder "
                             f"({exc})") from None
    return dict(denoiser=parts.pop("transformer"), noise_scheduler=parts.pop("scheduler"),
                **parts, version="qwen_image", variant=variant, prediction_type="flow",
                source=str(path), name=path.name, description=LABELS[variant])


def _processor(path: Path, variant: str) -> dict[str, Any]:
    """An edit folder's processor, read without torchvision (edit.load_processor)."""
    if not is_edit(variant):
        return {}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"), local_files_only=True)
    return {"tokenizer": tokenizer,
            "processor": load_processor(path / "processor", tokenizer, str(path))}


def load_file(path: Path, section: Any, *, dtype: Any = None, t5_frozen: bool = False,
              defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """A Qwen-Image single file and its part files (``model.text_encoder``, ``model.vae``)."""
    from trainer.families.qwen_image.single_file import load_qwen_file

    return load_qwen_file(path, section, dtype=dtype, defer_denoiser=defer_denoiser,
                          store=fresh, text_frozen=t5_frozen)


def doctor_lines(found: Any) -> list[str]:
    """The doctor's line on a single file (``found``: its detection) beyond its parts: where
    an edit model's Qwen2.5-VL image processor comes from (trainer/tools/model_report.py)."""
    from trainer.families.common.qwen_processor import FETCH, in_cache

    if found.layout != "single file" or found.header.variant == "layered":
        return []
    cached = in_cache()
    return [f"edit models' image processor: {cached.where}" if cached else
            f"edit models' image processor: not in the Hugging Face cache, the shipped copy "
            f"serves (`{FETCH}` fetches the model's own)"]
