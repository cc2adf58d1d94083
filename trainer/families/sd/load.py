"""SD 1.x, 2.x and SDXL as the loader reads them: a diffusers folder (``StableDiffusion*Pipeline``)
or a single checkpoint in the original layout (:mod:`trainer.families.sd.single_file` reads
its tensors, offline, with the family's built-in configs or ``model.config_dir``). Each
function returns the fields of :class:`trainer.models.loader.BaseModel`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer import families as registry
from trainer.families.sd import detect as families
from trainer.families.sd import single_file
from trainer.families.sd.detect import FAMILIES, Family, ModelLoadError
from trainer.models import tokenizers

FIELD = "model.pretrained_model_name_or_path"


def load_folder(path: Path, section: Any, detected: str) -> dict[str, Any]:
    """A diffusers folder whose ``model_index.json`` names ``detected``."""
    parts = _load_folder(path, len(registry.spec(detected).text_encoders) == 2)
    if section.vae:
        parts["vae"] = _load_vae(Path(section.vae).expanduser(), path)
    width = parts["text_encoder"].config.hidden_size
    version = _check_folder_version(detected, section.model_version, width)
    prediction = section.prediction_type or parts["noise_scheduler"].config.prediction_type
    resolution = families.native_resolution(parts["denoiser"].config, parts["vae"].config)
    return dict(**parts, version=version, prediction_type=prediction, source=str(path),
                     name=path.name,
                     description=families.describe(FAMILIES[version], prediction, resolution))


def load_file(path: Path, section: Any, *, dtype: Any = None, fresh: bool = True,
              **_: Any) -> dict[str, Any]:
    """A single checkpoint file; with ``model.base_precision = "fp8"`` (and ``fresh``: not for
    the diffusers copy) its UNet is stored in fp8 as it streams."""
    return _from_single_file(path, section, single_file.fp8_unet(section, dtype)
                             if fresh else None)


def _check_folder_version(detected: str, requested: str, width: int) -> str:
    if requested == "auto" or requested == detected:
        return detected
    wanted = registry.spec(requested)
    if wanted.denoiser != "unet":  # a transformer family: its own folder loader reads it
        raise ModelLoadError(f"model.model_version = {requested!r}, but {FIELD} holds a "
                             f"{FAMILIES[detected].label} model; point {FIELD} at a "
                             f"{wanted.label} diffusers folder or single file, or set "
                             f"model.model_version to 'auto'")
    # SD 1.x and 2.x share a folder: a tiny model of neither's width may be either
    if wanted.folder != registry.spec(detected).folder or width in (768, 1024):
        raise ModelLoadError(f"model.model_version = {requested!r}, but the model looks like "
                             f"{detected} (text encoder width {width}); set it to auto")
    return requested  # a model of no standard width (a tiny test model): as the setting says


def _load_folder(path: Path, sdxl: bool) -> dict[str, Any]:
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    local = {"local_files_only": True}
    try:
        parts = {
            "denoiser": UNet2DConditionModel.from_pretrained(path, subfolder="unet", **local),
            "vae": AutoencoderKL.from_pretrained(path, subfolder="vae", **local),
            "text_encoder": CLIPTextModel.from_pretrained(path, subfolder="text_encoder",
                                                          **local),
            "tokenizer": CLIPTokenizer.from_pretrained(path, subfolder="tokenizer", **local),
            "noise_scheduler": DDPMScheduler.from_pretrained(path, subfolder="scheduler",
                                                             **local),
        }
        if sdxl:
            parts["text_encoder_2"] = CLIPTextModelWithProjection.from_pretrained(
                path, subfolder="text_encoder_2", **local)
            parts["tokenizer_2"] = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer_2",
                                                                 **local)
        return parts
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot load the diffusers folder "
                             f"({exc})") from None


def _load_vae(path: Path, config_dir: Path):
    """``model.vae``: a diffusers folder (``vae/`` inside or itself) or a VAE file."""
    from diffusers import AutoencoderKL

    if path.is_file():
        try:
            return single_file.load_vae_file(path, config_dir)
        except ModelLoadError as exc:
            raise ModelLoadError(f"model.vae = {str(path)!r}: {exc}") from None
    try:
        sub = "vae" if (path / "vae").is_dir() else None
        return AutoencoderKL.from_pretrained(path, subfolder=sub, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"model.vae = {str(path)!r}: cannot load the VAE ({exc})") from None


def _configs(family: Family, section: Any, evidence: families.Evidence
             ) -> tuple[Path, str, str]:
    """(config folder, prediction type, why that prediction type)."""
    from diffusers import DDPMScheduler

    config_default = None
    if section.config_dir:
        config_dir = Path(section.config_dir).expanduser()
        if not (config_dir / "unet" / "config.json").is_file():
            raise ModelLoadError(f"model.config_dir = {str(config_dir)!r}: no unet/config.json "
                                 f"there; it must be a folder of diffusers component configs")
        try:
            config = DDPMScheduler.load_config(str(config_dir), subfolder="scheduler")
            config_default = config.get("prediction_type")
        except OSError:
            pass
    prediction, why = families.choose_prediction(family, section.prediction_type, evidence,
                                                 config_default)
    if not section.config_dir:
        config_dir = family.config_dir(prediction)
    return config_dir, prediction, why


def _tokenizers(family: Family, section: Any, path: Path) -> dict[str, Any]:
    out = {}
    for slot in family.encoders:
        found = tokenizers.locate(family, slot, section.tokenizer, path)
        out[slot.tokenizer] = tokenizers.load(found, slot.pad_token)
    return out


def _scheduler(config_dir: Path, family: Family, prediction: str):
    """Training's DDPM scheduler with the betas of ``config_dir`` (else the family's)."""
    from diffusers import DDPMScheduler

    try:
        config = DDPMScheduler.load_config(str(config_dir), subfolder="scheduler")
    except OSError:  # a model.config_dir without scheduler/: the family's schedule
        config = DDPMScheduler.load_config(str(family.config_dir(prediction)),
                                           subfolder="scheduler")
    return DDPMScheduler.from_config(config, prediction_type=prediction, clip_sample=False)


def _notes(ckpt: single_file.Checkpoint, found: families.Detected, why: str,
           section: Any) -> tuple[str, ...]:
    notes = [f"prediction type: {why}"]
    dtype = single_file.unet_dtype(ckpt)
    if dtype:
        notes.append(f"{dtype} weights")
    if found.ema_keys:
        notes.append(f"{found.ema_keys} {families.EMA_PREFIX}* keys ignored")
    if section.vae:
        notes.append("VAE from model.vae")
    if section.config_dir:
        notes.append(f"configs from model.config_dir {section.config_dir}")
    return tuple(notes)


def _open(path: Path, section: Any):
    """Open and check the file before any weight is read: family, shape, VAE, version."""
    ckpt = single_file.Checkpoint(path)
    try:
        found = single_file.inspect(ckpt)
        families.check_requested(found, section.model_version)
        if not section.config_dir:
            families.check_builtin_shape(found)
        if not found.has_vae and not section.vae:
            raise ModelLoadError("the file holds no VAE (no first_stage_model.* keys): set "
                                 "model.vae to a VAE file or a diffusers folder")
    except BaseException:
        ckpt.close()
        raise
    return ckpt, found


def _from_single_file(path: Path, section: Any, fp8: Any = None) -> dict[str, Any]:
    try:
        ckpt, found = _open(path, section)
        with ckpt:
            family = found.family
            evidence = families.prediction_evidence(ckpt.metadata, ckpt.keys, ckpt.global_step)
            config_dir, prediction, why = _configs(family, section, evidence)
            toks = _tokenizers(family, section, path)
            notes = _notes(ckpt, found, why, section)
            parts = single_file.load_modules(ckpt, found, config_dir, not section.vae, fp8)
    except ModelLoadError as exc:
        if str(exc).startswith(FIELD):
            raise
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: {exc}") from None
    if section.vae:
        parts["vae"] = _load_vae(Path(section.vae).expanduser(), config_dir)
    parts["denoiser"] = parts.pop("unet")
    resolution = families.native_resolution(parts["denoiser"].config, parts["vae"].config)
    return dict(**parts, **toks, noise_scheduler=_scheduler(config_dir, family, prediction),
                     version=family.name, prediction_type=prediction, source=str(path),
                     name=path.stem,
                     description=families.describe(family, prediction, resolution, notes))
