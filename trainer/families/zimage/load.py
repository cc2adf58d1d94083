"""Z-Image as the loader reads it: a diffusers folder (``ZImagePipeline``), or a single file of
the transformer (native or diffusers layout, bf16 or fp8) with the text-encoder file that
``model.text_encoder`` names and the VAE file of ``model.ae`` (:mod:`.single_file`). Each
function returns the fields of :class:`trainer.models.loader.BaseModel`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.families.spec import ModelLoadError
from trainer.families.zimage.detect import MAX_SEQUENCE_LENGTH, variant_of

FIELD = "model.pretrained_model_name_or_path"


def _check_version(path: Path, section: Any, what: str) -> None:
    if section.model_version not in ("auto", "zimage"):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r}, but it is {what}; set it to 'auto' "
                             f"or 'zimage'")


def load_folder(path: Path, section: Any, name: str = "zimage", defer_denoiser: bool = False,
                dtype: Any = None) -> dict[str, Any]:
    """A ``ZImagePipeline`` folder, every component by diffusers' ``from_pretrained``;
    ``defer_denoiser``: the transformer is read only when ``build_denoiser(dtype)`` is called
    (trainer/run/text_first.py: once the captions are encoded and Qwen3 let go). Qwen3 is
    cast to ``dtype`` (the run's compute dtype): transformers 5 reads it in the dtype it is
    stored in (bf16 in the released folders), which the run would otherwise keep in an fp32
    run (a bf16 matmul on a CPU without bf16 units is several times slower)."""
    import diffusers

    _check_version(path, section, "a Z-Image pipeline folder")
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a Z-Image folder, whose VAE is "
                             f"its own; unset model.vae")
    deferred = {"transformer": None} if defer_denoiser else {}
    try:
        parts = diffusers.ZImagePipeline.from_pretrained(path, local_files_only=True,
                                                         **deferred).components
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot load the Z-Image folder "
                             f"({exc})") from None
    variant = variant_of(path)
    if dtype is not None and parts["text_encoder"].dtype.is_floating_point:
        parts["text_encoder"].to(dtype)
    return dict(denoiser=parts["transformer"], noise_scheduler=parts["scheduler"],
                build_denoiser=(lambda dtype: _folder_transformer(path, dtype))
                if defer_denoiser else None,
                vae=parts["vae"], text_encoder=parts["text_encoder"],
                tokenizer=parts["tokenizer"], version="zimage", variant=variant,
                prediction_type="flow", source=str(path), name=path.name,
                description=f"{'Z-Image Turbo' if variant == 'turbo' else 'Z-Image'} "
                            f"(diffusers folder)",
                t5_max_length=MAX_SEQUENCE_LENGTH)


def _folder_transformer(path: Path, dtype: Any) -> Any:
    """The folder's transformer, read in ``dtype`` (the run's compute dtype)."""
    from diffusers import ZImageTransformer2DModel

    return ZImageTransformer2DModel.from_pretrained(path, subfolder="transformer",
                                                    torch_dtype=dtype, local_files_only=True)


def load_file(path: Path, section: Any, *, dtype: Any = None, t5_frozen: bool = False,
              defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """A Z-Image single file and its part files (see :mod:`.single_file`)."""
    from trainer.families.zimage.single_file import load_single_file

    _check_version(path, section, "a Z-Image file")
    return load_single_file(path, section, dtype=dtype, text_frozen=t5_frozen,
                            defer_denoiser=defer_denoiser, fresh=fresh)
