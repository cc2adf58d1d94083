"""Load a base model: a diffusers folder, a single checkpoint file, or the embedded tiny model.

Every source ends in the same :class:`BaseModel` of diffusers/transformers modules, so the loop
and the methods never care where the weights came from.

A single ``.safetensors``/``.ckpt`` file loads with no network access: its family is read from
the header (:mod:`trainer.families.sd.detect`), its configs are the family's built-in ones or
``model.config_dir``, its weights go through diffusers' converters one component at a time
(:mod:`trainer.families.sd.load`) and its tokenizer is looked up locally
(:mod:`trainer.models.tokenizers`). With ``model.cache_as_diffusers`` the result is kept as a
diffusers folder under the studio's data folder, keyed by the file's identity and the settings
that shape the result, and loaded from there next time; by default nothing is written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer import families as registry
from trainer.config import ModelSection
from trainer.config.paths import data_home
from trainer.families.common import files as file_checks
from trainer.families.sd import detect as families
from trainer.families.sd import load as single_file
from trainer.families.sd.detect import FAMILIES, Family, ModelLoadError
from trainer.models import lazy_diffusers, tokenizers

EMBEDDED_MODELS = {s.embedded: s.name for s in registry.FAMILIES.values() if s.embedded}

__all__ = ["BaseModel", "ModelLoadError", "load_base_model", "resolve_model_path",
           "text_embeddings"]
FIELD = "model.pretrained_model_name_or_path"
CACHE_INFO = "single_file.json"


@dataclass
class BaseModel:
    denoiser: Any  # a UNet (SD 1.x, 2.x, SDXL) or a transformer (FLUX.1, SD 3.5)
    vae: Any
    text_encoder: Any
    tokenizer: Any
    noise_scheduler: Any
    version: str  # "sd1" | "sd2" | "sdxl" | "flux1" | "sd3"
    prediction_type: str  # "epsilon" | "v_prediction" | "flow" (FLUX.1, SD 3.5)
    source: str
    name: str
    text_encoder_2: Any = None  # SDXL's OpenCLIP bigG (CLIPTextModelWithProjection)
    tokenizer_2: Any = None  # FLUX.1: T5's (text_encoder_2 is T5-XXL)
    text_encoder_3: Any = None  # SD 3.5's T5-XXL
    tokenizer_3: Any = None
    description: str = ""  # for people: "SD 2.x, v-prediction, 768 (...)"
    variant: str = ""  # FLUX.1 "dev" / "schnell"; SD 3.x "5-large" / "5-medium" / "medium"
    t5_max_length: int = 0  # tokens of T5 per caption (the flow families)
    prompt_options: Any = None  # SD families: long / weighted / unpadded captions (long_prompts)
    build_denoiser: Any = None  # (dtype) -> the denoiser, while that is None (text_first)

    @property
    def unet(self) -> Any:
        """The denoiser under its old name, read-only (for the tests' and the tools' reads)."""
        return self.denoiser

    @property
    def vae_id(self) -> str:
        """Identity of the VAE for the latent cache: its config and a hash of its weights."""
        h = hashlib.sha256(json.dumps(dict(self.vae.config), sort_keys=True, default=str)
                           .encode())
        for key, tensor in sorted(self.vae.state_dict().items()):
            h.update(key.encode())
            h.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
        return h.hexdigest()[:16]


def resolve_model_path(value: str) -> Path:
    """The path behind ``model.pretrained_model_name_or_path`` (building the embedded model)."""
    if value in EMBEDDED_MODELS:  # the family's tiny twin, built once (its tiny role)
        family = EMBEDDED_MODELS[value]
        folder = data_home() / "embedded" / value.split(":", 1)[1]
        return registry.role(family, "tiny").ensure(folder, family)
    if value.startswith("embedded:"):
        raise ModelLoadError(
            f"{FIELD} = {value!r}: unknown embedded model; the embedded models are "
            f"{', '.join(map(repr, EMBEDDED_MODELS))}"
        )
    return Path(value).expanduser()


def load_base_model(section: ModelSection, dtype: Any = None, t5_frozen: bool = False,
                    defer_denoiser: bool = False) -> BaseModel:
    """The base model that ``section`` names; ``dtype``: the run's compute dtype, which a
    FLUX.1 / SD 3.x single file is built in (the others load in fp32, but for an SD file's UNet
    with model.base_precision = "fp8", stored in fp8 at the load); ``t5_frozen``: the run
    does not train T5 (its fp8 storage may then begin at the load); ``defer_denoiser``: a
    FLUX.1 / SD 3.x single file's transformer is left unbuilt (``denoiser`` None) until
    ``build_denoiser(dtype)`` is called (trainer/run/text_first.py)."""
    lazy_diffusers.install()  # import only the UNet / transformer and autoencoder it uses
    path = resolve_model_path(section.pretrained_model_name_or_path)
    if not path.exists():
        raise ModelLoadError(
            f"{FIELD} = {str(path)!r}: no such file or folder; point it at a diffusers folder "
            f"(with model_index.json) or a .safetensors/.ckpt checkpoint"
        )
    file_checks.check_base_model_file(path, FIELD)  # empty, truncated, lying, a LoRA ...
    if path.is_dir():
        return _from_folder(path, section)
    if path.suffix.lower() in (".safetensors", ".ckpt"):
        cached = _cache_folder(path, section) if section.cache_as_diffusers else None
        if cached is not None and (cached / CACHE_INFO).is_file():
            return _from_cache(cached, path, section)
        from trainer.families.common.mmdit_folder import load_flow_file

        if _flow_file(path):  # no fp8 / NF4 at the load for the diffusers copy: as loaded
            model = BaseModel(**load_flow_file(path, section, dtype, t5_frozen,
                                               defer_denoiser and cached is None, cached is None))
        else:
            model = _from_single_file(path, section, single_file.fp8_unet(section, dtype)
                                      if cached is None else None)
        if cached is not None:
            _save_cache(model, cached)
        return model
    raise ModelLoadError(f"{FIELD} = {str(path)!r}: not a diffusers folder nor a "
                         f".safetensors/.ckpt file")


# --- diffusers folders ------------------------------------------------------------------------


def _flow_file(path: Path) -> bool:
    """Whether the file holds a transformer family's model (FLUX.1, SD 3.x;
    :func:`trainer.families.detect_path`), which the MMDiT loader reads; for another, the UNet
    families' loader reports what it holds."""
    name = registry.family_or_none(path)
    return name is not None and registry.spec(name).denoiser == "transformer"


def _folder_version(path: Path) -> str:
    """The family of a diffusers folder, from its JSON files (no weights read)."""
    from trainer.families import folder_family

    if not (path / "model_index.json").is_file():
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: the folder has no model_index.json; "
                             f"it must be a diffusers Stable Diffusion folder")
    return folder_family(path) or "sd1"  # the component load below names what is missing


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


def _from_folder(path: Path, section: ModelSection) -> BaseModel:
    from trainer.families.common.mmdit_folder import folder_flow_family, load_flow_folder

    flow = folder_flow_family(path)
    if flow is not None:
        if section.vae:
            raise ModelLoadError(f"model.vae is set, but {FIELD} is a FLUX.1 / SD 3.5 folder, "
                                 f"whose VAE is its own; unset model.vae")
        return BaseModel(**load_flow_folder(path, section, flow))
    detected = _folder_version(path)
    parts = _load_folder(path, len(registry.spec(detected).text_encoders) == 2)
    if section.vae:
        parts["vae"] = _load_vae(Path(section.vae).expanduser(), path)
    width = parts["text_encoder"].config.hidden_size
    version = _check_folder_version(detected, section.model_version, width)
    prediction = section.prediction_type or parts["noise_scheduler"].config.prediction_type
    resolution = families.native_resolution(parts["denoiser"].config, parts["vae"].config)
    return BaseModel(**parts, version=version, prediction_type=prediction, source=str(path),
                     name=path.name,
                     description=families.describe(FAMILIES[version], prediction, resolution))


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


# --- single checkpoint files ------------------------------------------------------------------


def _configs(family: Family, section: ModelSection, evidence: families.Evidence
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


def _tokenizers(family: Family, section: ModelSection, path: Path) -> dict[str, Any]:
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
           section: ModelSection) -> tuple[str, ...]:
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


def _open(path: Path, section: ModelSection):
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


def _from_single_file(path: Path, section: ModelSection, fp8: Any = None) -> BaseModel:
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
    return BaseModel(**parts, **toks, noise_scheduler=_scheduler(config_dir, family, prediction),
                     version=family.name, prediction_type=prediction, source=str(path),
                     name=path.stem,
                     description=families.describe(family, prediction, resolution, notes))


# --- model.cache_as_diffusers -----------------------------------------------------------------


def _cache_folder(path: Path, section: ModelSection) -> Path:
    """Where the diffusers copy of ``path`` lives: keyed by the file and the shaping settings."""
    stat = path.stat()
    key = json.dumps({
        "file": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
        "config_dir": section.config_dir, "tokenizer": section.tokenizer,
        "prediction_type": section.prediction_type, "vae": section.vae,
    }, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return data_home() / "single-file-cache" / f"{path.stem}-{digest}"


def _save_cache(model: BaseModel, folder: Path) -> None:
    pipe = registry.family_of(model).pipeline(model, model.denoiser, model.noise_scheduler)
    tmp = folder.with_name(folder.name + ".partial")
    try:
        pipe.save_pretrained(tmp, safe_serialization=True)
        (tmp / CACHE_INFO).write_text(json.dumps({
            "source": model.source, "version": model.version, "description": model.description,
        }, indent=2), encoding="utf-8")
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        tmp.rename(folder)
    except OSError as exc:
        raise ModelLoadError(f"model.cache_as_diffusers: cannot write {folder} ({exc})") from None


def _from_cache(folder: Path, path: Path, section: ModelSection) -> BaseModel:
    info = json.loads((folder / CACHE_INFO).read_text(encoding="utf-8"))
    if section.model_version not in ("auto", info["version"]):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r}, but the file is "
                             f"{FAMILIES[info['version']].label}; set model.model_version to "
                             f"'auto' or {info['version']!r}")
    cached = section.model_copy(update={"vae": None, "model_version": info["version"]})
    model = _from_folder(folder, cached)  # its VAE is the one loaded at first
    model.source, model.name = str(path), path.stem
    model.description = f"{info['description']} [from the diffusers copy in {folder}]"
    return model


def text_embeddings(text_encoder, input_ids, clip_skip: int = 1, attention_mask: Optional[Any]
                    = None):
    """Hidden states for the UNet: the last layer, or the clip_skip-th from last, normed."""
    if clip_skip == 1:
        return text_encoder(input_ids, attention_mask=attention_mask)[0]
    out = text_encoder(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hidden = out.hidden_states[-clip_skip]
    # transformers 5 dropped the text_model level that 4.x had
    inner = getattr(text_encoder, "text_model", text_encoder)
    return inner.final_layer_norm(hidden)
