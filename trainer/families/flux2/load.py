"""FLUX.2 as the loader reads it: a diffusers folder (``Flux2KleinPipeline`` for klein,
``Flux2Pipeline`` for dev), or a single file of the transformer (BFL or diffusers layout, bf16
or fp8) with the text-encoder file that ``model.text_encoder`` names (Qwen3 for klein,
Mistral-Small-3 for dev) and the VAE file of ``model.ae`` (:mod:`.single_file`). A dev folder's
``tokenizer/`` is a ``PixtralProcessor``'s, which needs torchvision: its tokenizer is read alone
(:mod:`trainer.families.common.qwen_tokenizers`' "mistral3" kind), which encodes text prompts
the same. Each function returns the fields of :class:`trainer.models.loader.BaseModel`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.families.flux2.detect import (
    LABELS,
    MAX_SEQUENCE_LENGTH,
    base_from_name,
    variant_of,
    with_base,
)
from trainer.families.spec import ModelLoadError

FIELD = "model.pretrained_model_name_or_path"


def check_version(path: Path, section: Any, what: str) -> None:
    if section.model_version not in ("auto", "flux2"):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r}, but it is {what}; set it to 'auto' "
                             f"or 'flux2'")


def folder_variant(path: Path, index: dict[str, Any], transformer_config: Any) -> str:
    """The folder's variant: the transformer's width, klein-base where the pipeline config says
    ``is_distilled: false`` or the folder's name says base."""
    variant = variant_of(dict(transformer_config))
    base = index.get("is_distilled") is False or base_from_name(path)
    return with_base(variant, base)


def load_folder(path: Path, section: Any, name: str = "flux2", defer_denoiser: bool = False,
                dtype: Any = None) -> dict[str, Any]:
    """A ``Flux2KleinPipeline`` / ``Flux2Pipeline`` folder, every component by diffusers'
    ``from_pretrained``; ``defer_denoiser``: the transformer is read only when
    ``build_denoiser(dtype)`` is called (trainer/run/text_first.py: once the captions are
    encoded and the text encoder let go, as for a single file: dev's 32B transformer and 24B
    Mistral are never in memory together). The text encoder is cast to ``dtype`` (the run's
    compute dtype; transformers 5 reads it in the dtype it is stored in)."""
    import json

    import diffusers

    check_version(path, section, "a FLUX.2 pipeline folder")
    index = json.loads((Path(path) / "model_index.json").read_text(encoding="utf-8"))
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a FLUX.2 folder, whose VAE is "
                             f"its own; unset model.vae")
    pipeline = getattr(diffusers, index["_class_name"])
    tokenizer = None  # diffusers then loads the folder's own
    if (index.get("tokenizer") or [None, None])[1] == "PixtralProcessor":
        from trainer.families.common.qwen_tokenizers import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer("mistral3", section.tokenizer or str(path))
    extra = {} if tokenizer is None else {"tokenizer": None}  # not loaded: given after
    if defer_denoiser:
        extra["transformer"] = None
    try:
        parts = pipeline.from_pretrained(path, local_files_only=True, **extra).components
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot load the FLUX.2 folder "
                             f"({exc})") from None
    if tokenizer is not None:
        parts["tokenizer"] = tokenizer
    if dtype is not None and parts["text_encoder"].dtype.is_floating_point:
        parts["text_encoder"].to(dtype)
    config = json.loads((Path(path) / "transformer" / "config.json").read_text("utf-8"))
    variant = folder_variant(path, index, config)
    return dict(denoiser=parts["transformer"], noise_scheduler=parts["scheduler"],
                build_denoiser=(lambda dtype: _folder_transformer(path, dtype))
                if defer_denoiser else None,
                vae=parts["vae"], text_encoder=parts["text_encoder"],
                tokenizer=parts["tokenizer"], version="flux2", variant=variant,
                prediction_type="flow", source=str(path), name=Path(path).name,
                description=f"{LABELS[variant]} (diffusers folder)",
                t5_max_length=MAX_SEQUENCE_LENGTH)


def _folder_transformer(path: Path, dtype: Any) -> Any:
    """The folder's transformer, read in ``dtype`` (the run's compute dtype)."""
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel.from_pretrained(path, subfolder="transformer",
                                                   torch_dtype=dtype, local_files_only=True)


def load_file(path: Path, section: Any, *, dtype: Any = None, t5_frozen: bool = False,
              defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """A FLUX.2 single file and its part files (see :mod:`.single_file`)."""
    from trainer.families.flux2.single_file import load_single_file

    check_version(path, section, "a FLUX.2 file")
    return load_single_file(path, section, dtype=dtype, text_frozen=t5_frozen,
                            defer_denoiser=defer_denoiser, fresh=fresh)
