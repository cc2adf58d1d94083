"""Z-Image from the split files ComfyUI users download: the diffusion model
(``z_image_turbo_bf16.safetensors``, native layout, bare or under ``model.diffusion_model.``, or
the diffusers layout; bf16, plain fp8 or ComfyUI's scaled fp8), the Qwen3-4B text encoder file
that ``model.text_encoder`` names (``qwen_3_4b.safetensors``) and the VAE file of ``model.ae``
(``ae.safetensors``, FLUX.1's); or one all-in-one file holding them (``vae.``,
``text_encoders.qwen3_4b.transformer.``).

The transformer is built on the meta device from its config (``model.config_dir``'s, else the
shipped ``trainer/assets/families/z-image-turbo``, with the header's widths and depths) and
filled from the file a group of tensors at a time in the run's dtype, each group converted by
diffusers' ``convert_z_image_transformer_checkpoint_to_diffusers`` (native layout); ComfyUI's
scaled weights are dequantized as they are read (:mod:`trainer.families.common.comfy_quant`).
With ``model.base_precision = "fp8"`` the weights that fp8 storage keeps arrive in fp8 and the
whole transformer is never held in the compute dtype. Qwen3 is filled the same way (in fp8 with
``model.fp8_text_encoders`` when the run does not train it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.common.streaming import fill_from, finish, open_reader
from trainer.families.spec import ModelLoadError
from trainer.families.zimage.detect import FILES as DETECTED_FILES
from trainer.families.zimage.detect import (
    TEXT_PREFIX,
    VAE_PREFIX,
    WHERE,
    ZImageFileInfo,
    header_info,
)

FIELD = "model.pretrained_model_name_or_path"
TEXT_MARK = "layers.0.self_attn.q_norm.weight"
FILES = {WHERE[part]: file for part, file in DETECTED_FILES.items()}


def transformer_config(info: ZImageFileInfo, root: Path) -> dict[str, Any]:
    config = json.loads((root / "transformer" / "config.json").read_text(encoding="utf-8"))
    config.update(info.config)
    return config


def build_transformer(path: Path, info: ZImageFileInfo, root: Path, dtype: torch.dtype,
                      fp8: bool = False) -> torch.nn.Module:
    from accelerate import init_empty_weights
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_z_image_transformer_checkpoint_to_diffusers as convert,
    )

    where = f"{FIELD} = {str(path)!r}"
    try:
        with init_empty_weights():
            module = ZImageTransformer2DModel.from_config(transformer_config(info, root))
    except Exception as exc:  # noqa: BLE001 - a config the shapes do not fit
        from trainer.families.common.mmdit_parts import fail

        raise fail(where, "transformer", exc) from None
    reader = open_reader(path, dtype)
    others = (VAE_PREFIX, "text_encoders.")
    keys = [k for k in reader.entries if k.startswith(info.prefix) and not k.startswith(others)]
    module = fill_from(module, reader, keys, info.prefix,
                       convert if info.layout == "native" else None, dtype, fp8, where,
                       "transformer")
    return finish(module, dtype, fp8, where, "transformer")


def build_text_encoder(path: Path, setting: str, root: Path, dtype: torch.dtype,
                       fp8: bool = False) -> torch.nn.Module:
    """Qwen3 (a ``Qwen3Model``) from a file of transformers' names: ComfyUI's (``model.``), a
    bare ``Qwen3Model``'s, or under an all-in-one file's prefix."""
    from accelerate import init_empty_weights
    from transformers import Qwen3Config, Qwen3Model

    where = f"{setting} = {str(path)!r}"
    reader = open_reader(path, dtype)
    prefix = next((p for p in (TEXT_PREFIX + "model.", "model.", "")
                   if p + TEXT_MARK in reader.entries), None)
    if prefix is None:
        raise ModelLoadError(f"{where}: no Qwen3 text encoder (model.{TEXT_MARK}) in it; point "
                             f"model.text_encoder at {FILES['model.text_encoder']}")
    with init_empty_weights():
        module = Qwen3Model(Qwen3Config.from_pretrained(str(root / "text_encoder")))
    keys = [k for k in reader.entries if k.startswith(prefix)]
    module = fill_from(module, reader, keys, prefix, None, dtype, fp8, where, "text_encoder")
    return finish(module, dtype, fp8, where, "text_encoder")


def part_file(setting: str, value: Optional[str], what: str) -> Path:
    if not value:
        raise ModelLoadError(f"{FIELD} holds the Z-Image transformer without its {what}: set "
                             f"{setting} to {FILES[setting]}")
    found = Path(value).expanduser()
    if not found.is_file():
        raise ModelLoadError(f"{setting} = {value!r}: no such file; point it at "
                             f"{FILES[setting]}")
    return found


def load_tokenizer(section: Any, path: Path, text_file: Path) -> Any:
    """Qwen3's tokenizer as the Qwen-encoded families find it
    (:mod:`trainer.families.common.qwen_tokenizers`): ``model.tokenizer``, beside the text
    encoder's file or the model's, the Hugging Face cache; else the error with the
    ``hf download`` command."""
    from trainer.families.common.qwen_tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer("qwen3", section.tokenizer, [text_file, path])


def load_single_file(path: Path, section: Any, *, dtype: Any = None, text_frozen: bool = False,
                     defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """The BaseModel fields of a Z-Image file and the part files its settings name."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from trainer.families import spec
    from trainer.families.common.files import read_safetensors_header
    from trainer.families.common.mmdit_parts import Weights, build_vae
    from trainer.families.zimage.detect import MAX_SEQUENCE_LENGTH, variant_of

    dtype = dtype or torch.float32
    info = header_info(read_safetensors_header(path).tensors)
    if info is None:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: no Z-Image transformer in it")
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a Z-Image file: name its "
                             f"autoencoder with model.ae")
    variant = variant_of(path)
    root = Path(section.config_dir).expanduser() if section.config_dir else \
        spec("zimage").assets(variant)
    vae_file = path if "vae" in info.parts_inside else part_file("model.ae", section.ae, "VAE")
    text_file = path if "qwen3" in info.parts_inside else \
        part_file("model.text_encoder", section.text_encoder, "text encoder")
    vae_prefix = VAE_PREFIX if vae_file == path else next(
        (p for p in ("", VAE_PREFIX, "first_stage_model.")
         if p + "decoder.conv_in.weight" in read_safetensors_header(vae_file).tensors), "")
    fp8 = fresh and section.base_precision == "fp8"
    build = lambda d: build_transformer(path, info, root, d, fp8)  # noqa: E731
    text_encoder = build_text_encoder(text_file, "model.text_encoder" if text_file != path
                                      else FIELD, root, dtype,
                                      fresh and section.fp8_text_encoders and text_frozen)
    return dict(
        denoiser=None if defer_denoiser else build(dtype),
        build_denoiser=build if defer_denoiser else None,
        vae=build_vae(Weights(vae_file, "model.ae" if vae_file != path else FIELD), vae_prefix,
                      root, dtype),
        text_encoder=text_encoder, tokenizer=load_tokenizer(section, path, text_file),
        noise_scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(
            str(root / "scheduler"), local_files_only=True),
        version="zimage", variant=variant, prediction_type="flow", source=str(path),
        name=path.stem, description=info.description.replace(
            "Z-Image Turbo", "Z-Image Turbo" if variant == "turbo" else "Z-Image"),
        t5_max_length=MAX_SEQUENCE_LENGTH)
