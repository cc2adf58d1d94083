"""[model]: the base model and how it is read."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import (
    CLIP_L_FILE,
    DDPM,
    EMBEDDED_MODEL,
    FLOW,
    T5,
    Section,
    setting,
)
from trainer.config.sections.flow import FLOW_MODES
from trainer.families import model_versions

# "auto", a family of the registry, or a variant that only the setting can name
# (trainer.families.VERSIONS: qwen_image_edit, ...)
ModelVersion = Literal[("auto", *model_versions())]  # type: ignore[valid-type]


class ModelSection(Section):
    pretrained_model_name_or_path: str = setting(
        EMBEDDED_MODEL,
        "Base model: a diffusers folder (SD 1.x, 2.x, SDXL, FLUX.1, SD 3.5), a .safetensors/"
        ".ckpt file (SD 1.x, 2.x, SDXL), or an embedded tiny model: embedded:tiny-sd15, "
        "embedded:tiny-sdxl, embedded:tiny-flux, embedded:tiny-sd3.",
        widget="dir",
        label="Base model",
    )
    model_version: ModelVersion = setting(
        "auto", "Architecture of the base model; auto reads it from the model's configs "
        "(flux1: FLUX.1 dev or schnell; sd3: SD 3 and 3.5). flux1_kontext: FLUX.1 Kontext "
        "[dev], whose single file has FLUX.1-dev's keys: set it for flux1-kontext-dev."
        "safetensors; qwen_image_edit / qwen_image_edit_2509: Qwen-Image-Edit / -Edit-2509, "
        "whose single files (qwen_image_edit_*.safetensors) have Qwen-Image's keys (a "
        "diffusers folder, and a 2511 file, name themselves).",
        advanced=True,
        label="Model family",
    )
    prediction_type: Optional[Literal["epsilon", "v_prediction"]] = setting(
        None, "Training target; unset takes the base model's scheduler setting.", advanced=True,
        label="Prediction type",
        families=DDPM,
    )
    vae: Optional[str] = setting(
        None, "A different VAE (diffusers folder or file) instead of the model's own; "
        "Qwen-Image: the VAE file (qwen_image_vae.safetensors) for a diffusion-model file.",
        advanced=True, widget="dir",
        label="VAE override",
    )
    clip_skip: int = setting(
        1, "Use the output of the n-th last text-encoder layer (2 for many anime SD 1.x models); "
        "1 is each family's own: SD 2.x's encoder ends at the layer SD 2 reads, SDXL counts from "
        "the penultimate layer, as sd-scripts and AUTOMATIC1111 do.",
        advanced=True, ge=1, le=12,
        label="CLIP skip",
        families=DDPM,
    )
    tokenizer: Optional[str] = setting(
        None, "Tokenizer folder for a single-file model (the file holds none); unset looks "
        "beside the file, then in the Hugging Face cache.", advanced=True, widget="dir",
        label="Tokenizer folder",
    )
    config_dir: Optional[str] = setting(
        None, "Folder of diffusers component configs (unet/, vae/, text_encoder/, ...) for a "
        "single file of an unusual shape; unset uses the built-in SD 1.x, 2.x and SDXL ones.",
        advanced=True, widget="dir",
        label="Component config folder",
    )
    ae: Optional[str] = setting(
        None, "FLUX.1 / FLUX.2 / Z-Image / Chroma: the autoencoder file (ae.safetensors; "
        "FLUX.2: flux2-vae.safetensors) for a transformer-only single file (sd-scripts' --ae, "
        "musubi-tuner's --vae).", advanced=True, widget="file",
        families=("flux1", "flux1_kontext", "flux2", "zimage", "chroma"), modes=FLOW_MODES,
        label="Autoencoder file (ae)")
    clip_l: Optional[str] = setting(
        None, "FLUX.1 / SD 3.5: the CLIP-L text encoder file for a single file without it "
        "(sd-scripts' --clip_l).", advanced=True, widget="file",
        families=CLIP_L_FILE, modes=FLOW_MODES, label="CLIP-L file")
    clip_g: Optional[str] = setting(
        None, "SD 3.5: the CLIP-G text encoder file for a single file without it "
        "(sd-scripts' --clip_g).", advanced=True, widget="file",
        families=("sd3",), modes=FLOW_MODES, label="CLIP-G file")
    t5xxl: Optional[str] = setting(
        None, "FLUX.1 / SD 3.5 / Chroma: the T5-XXL text encoder file for a single file without it "
        "(sd-scripts' --t5xxl).", advanced=True, widget="file",
        families=T5, modes=FLOW_MODES, label="T5-XXL file")
    text_encoder: Optional[str] = setting(
        None, "FLUX.2 klein, Qwen-Image, Z-Image: the text encoder file for a diffusion-model "
        "file without it (klein: qwen_3_4b.safetensors, qwen_3_8b.safetensors for 9B; "
        "Qwen-Image: qwen_2.5_vl_7b.safetensors; Z-Image: qwen_3_4b.safetensors; "
        "musubi-tuner's --text_encoder).", advanced=True, widget="file",
        families=("flux2", "qwen_image", "zimage"), modes=FLOW_MODES, label="Text encoder file")
    t5xxl_max_token_length: Optional[int] = setting(
        None, "Tokens of T5 per caption; unset: 512 for FLUX.1-dev, 256 for schnell and "
        "SD 3.5 (sd-scripts' defaults).", advanced=True, ge=1, le=512,
        families=T5, modes=FLOW_MODES, label="T5 max tokens")
    cache_as_diffusers: bool = setting(
        False, "Keep a diffusers copy of a single-file model in the studio's data folder, "
        "loaded faster next time; off writes nothing.", advanced=True,
        label="Keep a diffusers copy",
    )
    base_precision: Literal["full", "fp8", "nf4", "int8"] = setting(
        "full", "How the frozen base weights are stored: full (the compute precision), fp8 "
        "(float8_e4m3fn, cast to the compute precision layer by layer: half of bf16's memory), "
        "nf4 / int8 (bitsandbytes 4-/8-bit Linear layers, QLoRA; where the installed "
        "bitsandbytes quantizes: CUDA, and the CPU from 0.45). Norms, embedders and the trained "
        "adapters stay in full precision; fp8 checkpoints load as shipped. LoRA and textual "
        "inversion only: DreamBooth trains these weights.", advanced=True,
        modes=("lora", "textual_inversion"), label="Base weight precision")
    fp8_text_encoders: bool = setting(
        False, "Store the frozen text encoder in fp8 too (FLUX.1 / SD 3.5's T5-XXL: 4.8 GB "
        "instead of 9.5 GB; Qwen-Image's Qwen2.5-VL-7B: 8.3 GB instead of 16.6, as "
        "musubi-tuner's --fp8_vl; FLUX.2 klein's Qwen3 alike), cast to the compute precision "
        "layer by layer.", advanced=True, families=FLOW, label="fp8 text encoder")
