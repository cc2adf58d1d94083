"""Load a base model: a diffusers folder, a single checkpoint file, or the embedded tiny model.

Every source ends in the same :class:`BaseModel` of diffusers/transformers modules, so the loop
and the methods never care where the weights came from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.config import EMBEDDED_MODEL, ModelSection
from trainer.paths import data_home


class ModelLoadError(ValueError):
    """A base model that cannot be loaded; the message names the setting and the file."""


@dataclass
class BaseModel:
    unet: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    noise_scheduler: Any
    version: str  # "sd1" | "sd2" | "sdxl"
    prediction_type: str  # "epsilon" | "v_prediction"
    source: str
    name: str

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
    if value == EMBEDDED_MODEL:
        from trainer.models.tiny import ensure_tiny_model

        return ensure_tiny_model(data_home() / "embedded" / "tiny-sd15")
    if value.startswith("embedded:"):
        raise ModelLoadError(
            f"model.pretrained_model_name_or_path = {value!r}: unknown embedded model; "
            f"the embedded model is {EMBEDDED_MODEL!r}"
        )
    return Path(value).expanduser()


def load_base_model(section: ModelSection) -> BaseModel:
    path = resolve_model_path(section.pretrained_model_name_or_path)
    field = "model.pretrained_model_name_or_path"
    if not path.exists():
        raise ModelLoadError(
            f"{field} = {str(path)!r}: no such file or folder; point it at a diffusers folder "
            f"(with model_index.json) or a .safetensors/.ckpt checkpoint"
        )
    if path.is_dir():
        parts = _load_folder(path, field)
    elif path.suffix.lower() in (".safetensors", ".ckpt"):
        parts = _load_single_file(path, field)
    else:
        raise ModelLoadError(f"{field} = {str(path)!r}: not a diffusers folder nor a "
                             f".safetensors/.ckpt file")
    if section.vae:
        parts["vae"] = _load_vae(Path(section.vae).expanduser())
    version = _detect_version(parts, section.model_version)
    prediction = section.prediction_type or parts["noise_scheduler"].config.prediction_type
    return BaseModel(**parts, version=version, prediction_type=prediction, source=str(path),
                     name=path.stem if path.is_file() else path.name)


def _load_folder(path: Path, field: str) -> dict[str, Any]:
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    index = path / "model_index.json"
    if not index.is_file():
        raise ModelLoadError(f"{field} = {str(path)!r}: the folder has no model_index.json; "
                             f"it must be a diffusers Stable Diffusion folder")
    if "text_encoder_2" in json.loads(index.read_text(encoding="utf-8")):
        raise ModelLoadError(f"{field} = {str(path)!r}: SDXL models are not supported yet; "
                             f"use an SD 1.x or 2.x model")
    try:
        return {
            "unet": UNet2DConditionModel.from_pretrained(path, subfolder="unet",
                                                         local_files_only=True),
            "vae": AutoencoderKL.from_pretrained(path, subfolder="vae", local_files_only=True),
            "text_encoder": CLIPTextModel.from_pretrained(path, subfolder="text_encoder",
                                                          local_files_only=True),
            "tokenizer": CLIPTokenizer.from_pretrained(path, subfolder="tokenizer",
                                                       local_files_only=True),
            "noise_scheduler": DDPMScheduler.from_pretrained(path, subfolder="scheduler",
                                                             local_files_only=True),
        }
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{field} = {str(path)!r}: cannot load the diffusers folder "
                             f"({exc})") from None


def _load_single_file(path: Path, field: str) -> dict[str, Any]:
    from diffusers import DDPMScheduler, StableDiffusionPipeline

    try:
        pipe = StableDiffusionPipeline.from_single_file(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - diffusers raises many kinds here
        raise ModelLoadError(
            f"{field} = {str(path)!r}: cannot load the checkpoint file ({exc}). Offline, "
            f"diffusers needs the model's configs in the Hugging Face cache; converting the "
            f"file to a diffusers folder once, where you have internet, also works"
        ) from None
    scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    return {"unet": pipe.unet, "vae": pipe.vae, "text_encoder": pipe.text_encoder,
            "tokenizer": pipe.tokenizer, "noise_scheduler": scheduler}


def _load_vae(path: Path):
    from diffusers import AutoencoderKL

    try:
        if path.is_file():
            return AutoencoderKL.from_single_file(str(path), local_files_only=True)
        sub = "vae" if (path / "vae").is_dir() else None
        return AutoencoderKL.from_pretrained(path, subfolder=sub, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"model.vae = {str(path)!r}: cannot load the VAE ({exc})") from None


def _detect_version(parts: dict[str, Any], requested: str) -> str:
    width = parts["text_encoder"].config.hidden_size
    detected = "sd2" if width == 1024 else "sd1"
    if requested not in ("auto", detected) and width in (768, 1024):
        raise ModelLoadError(f"model.model_version = {requested!r}, but the model looks like "
                             f"{detected} (text encoder width {width}); set it to auto")
    if requested == "sdxl":
        raise ModelLoadError("model.model_version = 'sdxl': SDXL is not supported yet")
    return detected if requested == "auto" else requested


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
