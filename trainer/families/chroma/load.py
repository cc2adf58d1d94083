"""Chroma as the loader reads it: a diffusers ``ChromaPipeline`` folder, or a single file in
Black Forest Labs' layout with its part files (``model.ae``, ``model.t5xxl``;
:mod:`trainer.families.chroma.single_file`). Each function returns the fields of
:class:`trainer.models.loader.BaseModel`."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from trainer.families.chroma import CHROMA
from trainer.families.spec import ModelLoadError

FIELD = "model.pretrained_model_name_or_path"
VARIANT = CHROMA.variants[0]


def _check_version(section: Any, path: Path, what: str) -> None:
    if section.model_version not in ("auto", CHROMA.name):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r}, but it is {what}; set it to 'auto' "
                             f"or {CHROMA.name!r}")


def _fields(path: Path, section: Any, description: str, name: str) -> dict[str, Any]:
    return dict(version=CHROMA.name, variant=VARIANT.name, prediction_type="flow",
                source=str(path), name=name, description=description,
                t5_max_length=section.t5xxl_max_token_length or VARIANT.t5_length)


def load_folder(path: Path, section: Any, name: str = "chroma") -> dict[str, Any]:
    """A ``ChromaPipeline`` folder, every component by diffusers' ``from_pretrained``."""
    from diffusers import ChromaPipeline

    _check_version(section, path, "a Chroma (ChromaPipeline) folder")
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a Chroma folder, whose VAE is "
                             f"its own; unset model.vae")
    try:
        parts = ChromaPipeline.from_pretrained(path, local_files_only=True).components
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot load the diffusers folder "
                             f"({exc})") from None
    parts.pop("image_encoder", None)  # IP-Adapter parts: not trained here
    parts.pop("feature_extractor", None)
    return dict(parts, denoiser=parts.pop("transformer"),
                noise_scheduler=parts.pop("scheduler"),
                **_fields(path, section, f"{VARIANT.label} (diffusers folder)", path.name))


def load_file(path: Path, section: Any, *, dtype: Any = None, t5_frozen: bool = False,
              defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """A Chroma single file and the part files its settings name, built in ``dtype`` (fp8 /
    NF4 / int8 storage of the transformer, fp8 of a frozen T5, where ``fresh``); the
    transformer left for ``build_denoiser(dtype)`` with ``defer_denoiser``."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    from trainer.families.chroma import single_file as sf
    from trainer.families.common.mmdit_parts import Weights, build_vae
    from trainer.families.common.mmdit_tokenizers import load_t5, locate

    dtype = dtype or torch.float32
    conf = Path(section.config_dir).expanduser() if section.config_dir else None
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a Chroma file: name its "
                             f"autoencoder with model.ae (FLUX.1's ae.safetensors)")
    main = Weights(path, FIELD)
    info, layout = sf.read_info(main)
    _check_version(section, path, info.description)
    length = section.t5xxl_max_token_length or VARIANT.t5_length
    parts: dict[str, Any] = {"tokenizer": load_t5(
        locate("t5xxl", "tokenizer", section.tokenizer, path), length)}
    quantized = section.base_precision if fresh and section.base_precision in ("nf4", "int8") \
        else None
    later = sf.transformer_later(path, info, conf, fresh and section.base_precision == "fp8",
                                 quantized, layout)
    with ExitStack() as stack:
        sf.transformer_root(info, conf, stack)  # a config it cannot build fails now
    found = sf.sources(info, main, {"vae": section.ae, "t5xxl": section.t5xxl})
    weights, prefix = found["vae"]
    parts["vae"] = build_vae(weights, sf.vae_prefix(weights) if prefix is None else prefix,
                             sf.config_root(conf, "vae"), dtype)
    weights, prefix = found["t5xxl"]
    parts["text_encoder"] = sf.build_t5(weights, prefix, info, conf, dtype,
                                        fresh and section.fp8_text_encoders and t5_frozen)
    root = conf if conf and (conf / "scheduler" / "scheduler_config.json").is_file() \
        else CHROMA.assets()
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(
        str(root), subfolder="scheduler", local_files_only=True)
    return dict(parts, denoiser=None if defer_denoiser else later(dtype),
                build_denoiser=later if defer_denoiser else None, noise_scheduler=scheduler,
                **_fields(path, section, info.description, path.stem))
