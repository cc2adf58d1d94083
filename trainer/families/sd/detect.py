"""The Stable Diffusion families a single checkpoint file can hold, and how to tell them apart.

A checkpoint in the original layout (CompVis latent diffusion for SD 1.x/2.x, Stability's
generative-models for SDXL) carries weights but no configs, so the studio ships the configs of
each family as data (``trainer/assets/families/<name>/``, documented in the README there) and
reads the family from the file's key names and a few shapes, all of which the safetensors header
holds, so detection never reads a weight:

- **SDXL**: a second text encoder ``conditioner.embedders.1.model.*`` (OpenCLIP bigG) beside
  ``conditioner.embedders.0.transformer.*`` (CLIP ViT-L). A file whose only encoder is
  ``conditioner.embedders.0.model.*`` is the SDXL refiner, which is not a base model to train.
- **SD 2.x**: ``cond_stage_model.model.*`` (OpenCLIP ViT-H, context width 1024).
- **SD 1.x**: ``cond_stage_model.transformer.*`` (CLIP ViT-L, context width 768).

The UNet's context width (``attn2.to_k`` of its first cross-attention) and input channels are
checked against the family's, so an inpainting model (9 input channels) or another odd shape is
named instead of failing deep inside diffusers; ``model.config_dir`` loads such files.

SD 2.x comes as a 512 px epsilon model and a 768 px v-prediction model with identical weight
shapes, so the weights cannot tell which. The rule (:func:`prediction_evidence`), first match:
``model.prediction_type``; the file's own word (``modelspec.prediction_type`` or a
``modelspec.architecture`` ending in ``-v`` in the safetensors metadata, as sd-scripts and the
Stability model spec write them; ComfyUI's ``v_pred`` marker key); ``global_step`` 875000 in a
``.ckpt`` (the SD 2.0 512-base release, diffusers' own test in ``single_file_utils``); and
otherwise v-prediction at 768 px, as diffusers assumes for SD 2.x (its default config is
stable-diffusion-2-1, the 768-v model). sd-scripts reads nothing and makes the user pass
``--v2 --v_parameterization``; the description says when the studio assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.families.spec import ASSETS, DetectionError, Found, ModelLoadError  # noqa: F401

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
EMA_PREFIX = "model_ema."
SD2_512_BASE_STEP = 875000


@dataclass(frozen=True)
class TextEncoderSlot:
    component: str  # "text_encoder" | "text_encoder_2"
    prefix: str  # where its weights start in the original layout
    model_class: str  # transformers class name
    tokenizer: str  # "tokenizer" | "tokenizer_2"
    pad_token: str  # CLIP ViT-L pads with <|endoftext|>, OpenCLIP with "!" (token 0)


@dataclass(frozen=True)
class Family:
    name: str  # "sd1" | "sd2" | "sdxl", the values of model.model_version
    label: str
    encoders: tuple[TextEncoderSlot, ...]
    context_dim: int  # cross-attention width of the UNet
    pipeline_class: str

    def config_dir(self, prediction_type: str) -> Path:
        """The built-in configs; SD 2.x has a 512 epsilon and a 768 v-prediction variant."""
        if self.name == "sd2":
            return ASSETS / ("sd2-768-v" if prediction_type == "v_prediction" else "sd2-512")
        return ASSETS / self.name


CLIP_L_PAD, OPEN_CLIP_PAD = "<|endoftext|>", "!"
FAMILIES: dict[str, Family] = {
    "sd1": Family("sd1", "SD 1.x", (TextEncoderSlot(
        "text_encoder", "cond_stage_model.transformer.", "CLIPTextModel", "tokenizer",
        CLIP_L_PAD),), 768, "StableDiffusionPipeline"),
    "sd2": Family("sd2", "SD 2.x", (TextEncoderSlot(
        "text_encoder", "cond_stage_model.model.", "CLIPTextModel", "tokenizer",
        OPEN_CLIP_PAD),), 1024, "StableDiffusionPipeline"),
    "sdxl": Family("sdxl", "SDXL", (
        TextEncoderSlot("text_encoder", "conditioner.embedders.0.transformer.", "CLIPTextModel",
                        "tokenizer", CLIP_L_PAD),
        TextEncoderSlot("text_encoder_2", "conditioner.embedders.1.model.",
                        "CLIPTextModelWithProjection", "tokenizer_2", OPEN_CLIP_PAD),
    ), 2048, "StableDiffusionXLPipeline"),
}


@dataclass(frozen=True)
class Detected:
    """What the header of a checkpoint says."""

    family: Family
    context_dim: Optional[int]
    in_channels: Optional[int]
    has_vae: bool
    ema_keys: int  # model_ema.* keys (ignored: the loader reads the non-EMA weights)


def _has_prefix(keys: Collection[str], prefix: str) -> bool:
    return any(k.startswith(prefix) for k in keys)


def _family_name(keys: Collection[str]) -> str:
    if _has_prefix(keys, "conditioner.embedders.1.model."):
        if not _has_prefix(keys, "conditioner.embedders.0.transformer."):
            raise DetectionError("it has SDXL's OpenCLIP text encoder but not its CLIP ViT-L one "
                                 "(conditioner.embedders.0.transformer.*)")
        return "sdxl"
    if _has_prefix(keys, "conditioner.embedders.0.model."):
        raise DetectionError("it is an SDXL refiner (its only text encoder is OpenCLIP bigG), "
                             "not a base model to train")
    if _has_prefix(keys, "cond_stage_model.model."):
        return "sd2"
    if _has_prefix(keys, "cond_stage_model.transformer."):
        return "sd1"
    raise DetectionError("it holds no text encoder (no cond_stage_model.* or conditioner.* "
                         "keys); a base model file has the UNet, the text encoder(s) and "
                         "usually the VAE")


def _unet_facts(keys: Collection[str], shape: Callable[[str], tuple[int, ...]]
                ) -> tuple[Optional[int], Optional[int]]:
    """Context width of the first cross-attention and the input channels of the UNet."""
    to_k = sorted(k for k in keys if k.startswith(UNET_PREFIX) and
                  k.endswith(".attn2.to_k.weight"))
    conv_in = UNET_PREFIX + "input_blocks.0.0.weight"
    context = shape(to_k[0])[1] if to_k else None
    channels = shape(conv_in)[1] if conv_in in keys else None
    return context, channels


def detect(keys: Collection[str], shape: Callable[[str], tuple[int, ...]]) -> Detected:
    """The family of a checkpoint in the original layout, from its key names and shapes."""
    if _has_prefix(keys, "lora_unet_") or _has_prefix(keys, "lora_te"):
        raise DetectionError("it is a LoRA (lora_unet_*/lora_te* keys), not a base model; "
                             "set it as network weights instead")
    if not _has_prefix(keys, UNET_PREFIX):
        hint = (" (its keys look like a diffusers UNet: save the model as a diffusers folder "
                "instead)" if _has_prefix(keys, "down_blocks.") else "")
        raise DetectionError(f"it holds no UNet in the original layout (no {UNET_PREFIX}* "
                             f"keys){hint}; a VAE, an embedding or a LoRA is not a base model")
    family = FAMILIES[_family_name(keys)]
    context, channels = _unet_facts(keys, shape)
    ema = sum(1 for k in keys if k.startswith(EMA_PREFIX))
    return Detected(family, context, channels, _has_prefix(keys, VAE_PREFIX), ema)


def check_builtin_shape(found: Detected) -> None:
    """Refuse a file that the family's built-in configs cannot hold, naming model.config_dir."""
    family = found.family
    problems = []
    if found.context_dim not in (None, family.context_dim):
        problems.append(f"its UNet's cross-attention width is {found.context_dim}, "
                        f"{family.label} has {family.context_dim}")
    if found.in_channels not in (None, 4):
        kind = " (an inpainting model)" if found.in_channels == 9 else ""
        problems.append(f"its UNet takes {found.in_channels} input channels{kind}, not 4")
    if problems:
        raise DetectionError("; ".join(problems) + f". The built-in {family.label} configs do "
                             "not fit it: set model.config_dir to a folder of diffusers configs "
                             "(unet/, vae/, text_encoder/, ...) of its shape")


def check_requested(found: Detected, requested: str) -> None:
    """``model.model_version`` set to a family other than the file's is an error."""
    if requested not in ("auto", found.family.name):
        from trainer.families import FAMILIES as ALL

        wanted = ALL[requested].label if requested in ALL else requested
        slot = found.family.encoders[-1]
        raise DetectionError(f"model.model_version = {requested!r} ({wanted}), but the file is "
                             f"{found.family.label} (text encoder at {slot.prefix}*); set "
                             f"model.model_version to 'auto' or {found.family.name!r}")


@dataclass(frozen=True)
class Evidence:
    prediction_type: Optional[str]  # None: the file does not say
    reason: str


def prediction_evidence(metadata: Mapping[str, str], keys: Collection[str],
                        global_step: Optional[int]) -> Evidence:
    """What the file says about its training target (see the module's docstring)."""
    spec = (metadata.get("modelspec.prediction_type") or "").strip().lower()
    if spec in ("epsilon", "v", "v_prediction"):
        return Evidence("epsilon" if spec == "epsilon" else "v_prediction",
                        "modelspec.prediction_type in the file")
    arch = (metadata.get("modelspec.architecture") or "").strip().lower()
    if arch.startswith("stable-diffusion-v2"):
        pred = "v_prediction" if arch.split("/")[0].endswith("-v") else "epsilon"
        return Evidence(pred, "modelspec.architecture in the file")
    if "v_pred" in keys:
        return Evidence("v_prediction", "the file's v_pred marker")
    if global_step == SD2_512_BASE_STEP:
        return Evidence("epsilon", f"global_step {SD2_512_BASE_STEP}: the SD 2.0 512-base release")
    return Evidence(None, "")


def choose_prediction(family: Family, setting: Optional[str], evidence: Evidence,
                      config_default: Optional[str]) -> tuple[str, str]:
    """(prediction type, why): the setting, the file, the configs, else the family's default."""
    if setting:
        return setting, "model.prediction_type"
    if evidence.prediction_type:
        return evidence.prediction_type, evidence.reason
    if config_default:
        return config_default, "model.config_dir"
    if family.name == "sd2":
        return "v_prediction", ("assumed for SD 2.x (768-v); set model.prediction_type = "
                                "'epsilon' for a 512 base model")
    return "epsilon", f"{family.label} default"


def describe(family: Family, prediction_type: str, resolution: Optional[int],
             notes: tuple[str, ...] = ()) -> str:
    """A readable line such as ``SD 2.x, v-prediction, 768``."""
    pred = "v-prediction" if prediction_type == "v_prediction" else prediction_type
    parts = [family.label, pred] + ([str(resolution)] if resolution else [])
    text = ", ".join(parts)
    return f"{text} ({'; '.join(notes)})" if notes else text


def native_resolution(unet_config: Mapping, vae_config: Mapping) -> Optional[int]:
    """The image size the UNet was configured for: its latent size times the VAE's factor."""
    size = unet_config.get("sample_size")
    blocks = vae_config.get("block_out_channels") or ()
    if not isinstance(size, int) or not blocks:
        return None
    return size * 2 ** (len(blocks) - 1)


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    """SD 1.x, 2.x or SDXL from a diffusers folder's ``model_index.json``; SD 1.x and 2.x share
    the pipeline, SD 2's OpenCLIP text encoder is 1024 wide with GELU."""
    import json

    cls = str(index.get("_class_name"))
    if cls == "StableDiffusionXLPipeline":
        return "sdxl"
    if cls != "StableDiffusionPipeline" and "unet" not in index:
        return None
    if cls != "StableDiffusionPipeline" and "text_encoder_2" in index:
        return "sdxl"  # another SD pipeline class of the same parts
    try:
        encoder = json.loads((folder / "text_encoder" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        encoder = {}
    if isinstance(encoder, dict) and (encoder.get("hidden_size") == 1024
                                      or encoder.get("hidden_act") == "gelu"):
        return "sd2"
    return "sd1"


def from_header(tensors: Mapping[str, Any]) -> Found:
    """SD 1.x, 2.x or SDXL from a single file's header; the last detection the registry tries,
    so it names what a file is when it is no family's (``DetectionError``)."""
    try:
        found = detect(set(tensors), lambda k: tuple(tensors[k]["shape"]))
    except (KeyError, TypeError, IndexError) as exc:
        raise DetectionError(f"its header is not a checkpoint's ({exc})") from None
    return Found(found.family.name, "single file", found.family.label, header=found)
