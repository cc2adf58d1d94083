"""Load a FLUX.1 or SD 3.5 diffusers folder (``FluxPipeline``, ``StableDiffusion3Pipeline``).

The folder's ``model_index.json`` names its pipeline; diffusers' own ``from_pretrained`` reads
every component, offline. The result is the same :class:`~trainer.models.loader.BaseModel` as
for the SD families, with the transformer in ``denoiser`` (the slot the loop and the
methods use), T5 in ``text_encoder_2`` (FLUX.1) or ``text_encoder_3`` (SD 3.5), and the
variant for people and for the files' metadata:

- FLUX.1 **dev** has a guidance embedder (``guidance_embeds``: guidance-distilled) and reads
  512 T5 tokens; **schnell** has none and reads 256 (sd-scripts' defaults);
- SD 3.5 **medium** has MMDiT-X's second attention in its first blocks
  (``dual_attention_layers``), SD 3.5 **large** normalises q and k (``qk_norm``) without it, and
  SD 3 medium has neither; the variants are named as sd-scripts' ``ss_base_model_version``
  writes them: ``5-medium``, ``5-large``, ``medium``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from trainer.families.spec import ModelLoadError

FIELD = "model.pretrained_model_name_or_path"
T5_LENGTHS = {"dev": 512, "schnell": 256}
SD3_T5_LENGTH = 256


def folder_flow_family(path: Path) -> Optional[str]:
    """``flux1`` / ``sd3`` for a diffusers folder of those pipelines, else None."""
    from trainer.families import folder_family, is_flow

    family = folder_family(path)
    return family if is_flow(family) else None


def is_flux1(family: str) -> bool:
    """FLUX.1 or a family of its layout (FLUX.1 Kontext): the families of the ``flux`` folder."""
    from trainer.families import spec

    return spec(family).folder == "flux"


def variant_of(family: str, transformer_config: Any) -> str:
    """dev / schnell for FLUX.1; 5-medium / 5-large / medium for SD 3.x (sd-scripts' names)."""
    if is_flux1(family):
        return "dev" if transformer_config.get("guidance_embeds") else "schnell"
    if transformer_config.get("dual_attention_layers"):
        return "5-medium"
    return "5-large" if transformer_config.get("qk_norm") else "medium"


def describe(family: str, variant: str) -> str:
    from trainer.families import spec

    if is_flux1(family):
        if family != "flux1":
            return spec(family).variant(variant).label
        return "FLUX.1-dev, guidance-distilled" if variant == "dev" else "FLUX.1-schnell"
    return {"5-medium": "SD 3.5 medium", "5-large": "SD 3.5 large"}.get(variant, "SD 3 medium")


def t5_length(family: str, variant: str, setting: Optional[int]) -> int:
    if setting is not None:
        return setting
    return T5_LENGTHS[variant] if is_flux1(family) else SD3_T5_LENGTH


def load_flow_folder(path: Path, section: Any, family: str) -> dict[str, Any]:
    """The BaseModel fields of a FLUX.1 / SD 3.5 diffusers folder (see the module docstring)."""
    import diffusers

    from trainer.families import label, spec

    if section.model_version not in ("auto", family):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r}, but the folder holds a "
                             f"{label(family)} pipeline; set it to 'auto' or {family!r}")
    cls = getattr(diffusers, spec(family).pipelines[0])
    try:
        parts = cls.from_pretrained(path, local_files_only=True).components
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot load the diffusers folder "
                             f"({exc})") from None
    transformer = parts.pop("transformer")
    variant = variant_of(family, transformer.config)
    fields = {"denoiser": transformer, "noise_scheduler": parts.pop("scheduler"), **parts}
    fields.pop("image_encoder", None)  # FLUX.1 Redux / IP-Adapter parts: not trained here
    fields.pop("feature_extractor", None)
    return dict(fields, version=family, variant=variant, prediction_type="flow",
                source=str(path), name=path.name, description=describe(family, variant),
                t5_max_length=t5_length(family, variant, section.t5xxl_max_token_length))


def load_flow_file(path: Path, section: Any, dtype: Any = None, t5_frozen: bool = False,
                   defer_denoiser: bool = False, store: bool = True) -> dict[str, Any]:
    """The BaseModel fields of a FLUX.1 / SD 3.x single file and the component files that
    ``model.ae`` / ``clip_l`` / ``clip_g`` / ``t5xxl`` name
    (trainer/families/common/mmdit_single_file.py);
    built in ``dtype`` (the run's compute dtype: a 12B FLUX.1 in fp32 is 48 GB), but for the
    weights that fp8 storage keeps, which load into fp8: the transformer's with
    ``model.base_precision = "fp8"``, T5's with ``model.fp8_text_encoders`` when the run does
    not train it (``t5_frozen``); with ``"nf4"`` / ``"int8"`` the transformer's Linear layers
    are quantized as they load. ``defer_denoiser``: the transformer is built later, by the
    ``build_denoiser`` field (trainer/run/text_first.py). ``store`` False: everything in
    ``dtype`` (for ``model.cache_as_diffusers``, whose copy must hold the file's weights, not
    fp8- or NF4-rounded ones; the memory options then apply after the load)."""
    import torch

    from trainer.families.common.mmdit_detect import detect_flow_file
    from trainer.families.common.mmdit_single_file import load_flow_components

    info = detect_flow_file(path)
    version = file_version(path, section.model_version, info)
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a FLUX.1 / SD 3.x file: name "
                             f"its autoencoder with model.ae (FLUX.1) or leave the file's own")
    parts = load_flow_components(path, ae=section.ae, clip_l=section.clip_l,
                                 clip_g=section.clip_g, t5xxl=section.t5xxl,
                                 config_dir=section.config_dir, tokenizer=section.tokenizer,
                                 dtype=dtype or torch.float32,
                                 fp8_transformer=store and section.base_precision == "fp8",
                                 fp8_t5=store and section.fp8_text_encoders and t5_frozen,
                                 quantize_transformer=section.base_precision if store and
                                 section.base_precision in ("nf4", "int8") else None,
                                 defer_transformer=defer_denoiser)
    transformer = parts.pop("transformer")
    return dict(parts, denoiser=transformer, noise_scheduler=parts.pop("scheduler"),
                build_denoiser=parts.pop("build_transformer", None),
                version=version, variant=info.variant, prediction_type="flow",
                source=str(path), name=path.stem,
                description=file_description(version, info),
                t5_max_length=t5_length(version, info.variant,
                                        section.t5xxl_max_token_length))


def file_version(path: Path, setting: str, info: Any) -> str:
    """The family a single file loads as: the file's (``auto``), or the one
    ``model.model_version`` names where that family reads the file's layout and variant (FLUX.1
    Kontext [dev] has FLUX.1-dev's keys: only the setting tells them apart)."""
    from trainer.families import spec

    if setting in ("auto", info.version):
        return info.version
    named = spec(setting)
    if named.folder == spec(info.version).folder and \
            info.variant in (v.name for v in named.variants):
        return setting
    raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = {setting!r}, but "
                         f"the file is {info.description}; set it to 'auto' or "
                         f"{info.version!r}")


def file_description(version: str, info: Any) -> str:
    """The log's description of a file loaded as ``version`` (the header's facts)."""
    from trainer.families import label

    if version == info.version:
        return info.description
    return f"{label(version)}, by model.model_version ({info.description})"


def load_folder(path: Path, section: Any, family: str) -> dict[str, Any]:
    """The load role of the MMDiT families: a diffusers folder, whose VAE is its own."""
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a FLUX.1 / SD 3.5 folder, "
                             f"whose VAE is its own; unset model.vae")
    return load_flow_folder(path, section, family)


def load_file(path: Path, section: Any, *, dtype: Any = None, t5_frozen: bool = False,
              defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """The load role of the MMDiT families: a single file and its part files (``fresh``
    False: the diffusers copy's load, kept as the file's weights; see :func:`load_flow_file`)."""
    return load_flow_file(path, section, dtype, t5_frozen, defer_denoiser, fresh)
