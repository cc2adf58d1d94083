"""Load a base model: a diffusers folder, a single checkpoint file, or the embedded tiny model.

Every source ends in the same :class:`BaseModel` of diffusers/transformers modules, so the loop
and the methods never care where the weights came from.

A single ``.safetensors``/``.ckpt`` file loads with no network access: its family is read from
the header (:mod:`trainer.families.sd.detect`), its configs are the family's built-in ones or
``model.config_dir``, its weights go through diffusers' converters one component at a time
(:mod:`trainer.families.sd.single_file`) and its tokenizer is looked up locally
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
from trainer.families.sd.detect import ModelLoadError
from trainer.models import lazy_diffusers

EMBEDDED_MODELS = {twin: s.name for s in registry.FAMILIES.values() for twin in s.twins}

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
    processor: Any = None  # an edit model's image processor for its text encoder (Qwen-Image-Edit)

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
    FLUX.1 / SD 3.x single file's transformer, or that of a folder whose family's load role
    takes ``defer_denoiser``, is left unbuilt (``denoiser`` None) until
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
        return _from_folder(path, section, dtype, defer_denoiser)
    if path.suffix.lower() in (".safetensors", ".ckpt"):
        cached = _cache_folder(path, section) if section.cache_as_diffusers else None
        if cached is not None and (cached / CACHE_INFO).is_file():
            return _from_cache(cached, path, section)
        # the file's family reads it (a .ckpt or an unreadable header: the last resort's
        # loader, which names what the file holds); the diffusers copy is kept as loaded, with
        # no fp8 / NF4 storage at the load
        name = registry.family_or_none(path) or registry.LAST_RESORT
        model = BaseModel(**registry.role(name, "load").load_file(
            path, section, dtype=dtype, t5_frozen=t5_frozen,
            defer_denoiser=defer_denoiser and cached is None, fresh=cached is None))
        if cached is not None:
            _save_cache(model, cached)
        return model
    raise ModelLoadError(f"{FIELD} = {str(path)!r}: not a diffusers folder nor a "
                         f".safetensors/.ckpt file")


# --- diffusers folders ------------------------------------------------------------------------


def _folder_version(path: Path) -> str:
    """The family of a diffusers folder, from its JSON files (no weights read)."""
    from trainer.families import folder_family

    if not (path / "model_index.json").is_file():
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: the folder has no model_index.json; "
                             f"it must be a diffusers Stable Diffusion folder")
    return folder_family(path) or registry.LAST_RESORT  # its load names what is missing


def _from_folder(path: Path, section: ModelSection, dtype: Any = None,
                 defer_denoiser: bool = False) -> BaseModel:
    """A diffusers folder through its family's load role; ``dtype`` (the run's compute dtype)
    and ``defer_denoiser`` reach a role whose ``load_folder`` takes them (the denoiser then
    waits for ``build_denoiser``). diffusers' models (the denoiser, the VAE) are filled from
    their files tensor by tensor, never with a whole file mapped beside the built model
    (:func:`trainer.models.streamed_load.streamed_folders`), the deferred denoiser too."""
    import inspect

    from trainer.models.streamed_load import streamed_folders

    name = _folder_version(path)
    load_folder = registry.role(name, "load").load_folder
    takes = inspect.signature(load_folder).parameters
    extra = {key: value for key, value in (("dtype", dtype), ("defer_denoiser", defer_denoiser))
             if value not in (None, False) and key in takes}
    with streamed_folders():
        fields = load_folder(path, section, name, **extra)
    if fields.get("build_denoiser") is not None:
        fields["build_denoiser"] = _streamed_build(fields["build_denoiser"])
    return BaseModel(**fields)


def _streamed_build(build: Any) -> Any:
    """``build(dtype)`` with diffusers' models filled tensor by tensor (see _from_folder)."""
    def streamed_build(dtype: Any) -> Any:
        from trainer.models.streamed_load import streamed_folders

        with streamed_folders():
            return build(dtype)

    return streamed_build


# --- single checkpoint files ------------------------------------------------------------------


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
                             f"{registry.label(info['version'])}; set model.model_version to "
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
