"""FLUX.2 from the split files people download: the diffusion model
(``flux-2-klein-4b.safetensors``, ``flux2_dev_fp8mixed.safetensors``; BFL layout, bare or under
``model.diffusion_model.``, or the diffusers layout; bf16, plain fp8 or ComfyUI's scaled fp8 /
fp8mixed), the text-encoder file that ``model.text_encoder`` names (Qwen3 for klein:
``qwen_3_4b.safetensors``, ``qwen_3_8b.safetensors`` for 9B; Mistral-Small-3 for dev:
``mistral_3_small_flux2_bf16.safetensors`` / ``_fp8``, :mod:`.mistral`) and the VAE file of
``model.ae`` (``flux2-vae.safetensors``); or one all-in-one file holding them (``vae.``,
``text_encoders.qwen3_4b.transformer.`` / ``text_encoders.mistral3_24b.transformer.``). The
variant (klein 4B / 9B / dev) is read from the header's shapes.

The transformer is built on the meta device from its config (``model.config_dir``'s, else the
shipped ``trainer/assets/families/flux2-klein-*``, with the header's widths and depths) and
filled from the file a group of tensors at a time in the run's dtype, each group converted by
diffusers' ``convert_flux2_transformer_checkpoint_to_diffusers`` (BFL layout); ComfyUI's scaled
weights are dequantized as they are read (:mod:`trainer.families.common.comfy_quant`). With
``model.base_precision = "fp8"`` the weights that fp8 storage keeps arrive in fp8 and the whole
transformer is never held in the compute dtype. Qwen3 is filled the same way (in fp8 with
``model.fp8_text_encoders`` when the run does not train it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.common.streaming import fill_from, finish, open_reader
from trainer.families.flux2.detect import (
    DEV_TEXT_FILE,
    LABELS,
    MAX_SEQUENCE_LENGTH,
    TEXT_PREFIXES,
    VAE_PREFIX,
    Flux2FileInfo,
    base_from_name,
    header_info,
    with_base,
)
from trainer.families.spec import ModelLoadError

FIELD = "model.pretrained_model_name_or_path"
TEXT_MARK = "layers.0.self_attn.q_norm.weight"
FILES = {"model.ae": "flux2-vae.safetensors (Comfy-Org/Flux-2-Klein split_files/vae/, or "
                     "ae.safetensors of black-forest-labs/FLUX.2-dev)",
         "model.text_encoder": "qwen_3_4b.safetensors for klein 4B, qwen_3_8b.safetensors for "
                               "9B (Comfy-Org/Flux-2-Klein split_files/text_encoders/), "
                               f"{DEV_TEXT_FILE} for dev (Comfy-Org/Flux-2-Dev)"}


def _config(root: Path, part: str) -> dict[str, Any]:
    return json.loads((root / part / "config.json").read_text(encoding="utf-8"))


def build_transformer(path: Path, info: Flux2FileInfo, root: Path, dtype: torch.dtype,
                      fp8: bool = False) -> torch.nn.Module:
    from accelerate import init_empty_weights
    from diffusers import Flux2Transformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers as convert,
    )

    where = f"{FIELD} = {str(path)!r}"
    config = {**_config(root, "transformer"), **info.config}
    try:
        with init_empty_weights():
            module = Flux2Transformer2DModel.from_config(config)
    except Exception as exc:  # noqa: BLE001 - a config the shapes do not fit
        from trainer.families.common.mmdit_parts import fail

        raise fail(where, "transformer", exc) from None
    reader = open_reader(path, dtype)
    others = (VAE_PREFIX, "text_encoders.")
    keys = [k for k in reader.entries if k.startswith(info.prefix) and not k.startswith(others)]
    module = fill_from(module, reader, keys, info.prefix,
                       convert if info.layout == "bfl" else None, dtype, fp8, where,
                       "transformer")
    return finish(module, dtype, fp8, where, "transformer")


def build_text_encoder(path: Path, setting: str, root: Path, dtype: torch.dtype,
                       fp8: bool = False) -> torch.nn.Module:
    """Qwen3 (a ``Qwen3ForCausalLM``, the pipeline's class) from a file of transformers' names:
    ComfyUI's (``model.``), or under an all-in-one file's prefix; without ``lm_head`` (tied in
    Qwen3-4B, and never read: klein takes hidden states) it shares the token embedding."""
    from accelerate import init_empty_weights
    from transformers import Qwen3Config, Qwen3ForCausalLM

    where = f"{setting} = {str(path)!r}"
    reader = open_reader(path, dtype)
    prefix = next((p for p in (*TEXT_PREFIXES, "") if p + "model." + TEXT_MARK in reader.entries),
                  None)
    if prefix is None:
        raise ModelLoadError(f"{where}: no Qwen3 text encoder (model.{TEXT_MARK}) in it; point "
                             f"model.text_encoder at {FILES['model.text_encoder']}")
    with init_empty_weights():
        module = Qwen3ForCausalLM(Qwen3Config.from_pretrained(str(root / "text_encoder")))
    keys = [k for k in reader.entries if k.startswith(prefix)]
    module = fill_from(module, reader, keys, prefix, None, dtype, fp8, where, "text_encoder")
    if prefix + "lm_head.weight" not in reader.entries:
        module.lm_head.weight = module.model.embed_tokens.weight
    return finish(module, dtype, fp8, where, "text_encoder")


def build_vae(path: Path, setting: str, root: Path, dtype: torch.dtype) -> torch.nn.Module:
    """``AutoencoderKLFlux2`` from the original (LDM) names and its BatchNorm statistics."""
    from diffusers import AutoencoderKLFlux2
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    from trainer.families.common.mmdit_parts import fail

    where = f"{setting} = {str(path)!r}"
    reader = open_reader(path, dtype)
    prefix = next((p for p in ("", VAE_PREFIX) if p + "decoder.conv_in.weight" in reader.entries
                   and p + "bn.running_mean" in reader.entries), None)
    if prefix is None:
        raise ModelLoadError(f"{where}: no FLUX.2 VAE (decoder.conv_in.weight with "
                             f"bn.running_mean) in it; point model.ae at {FILES['model.ae']}")
    tensors = {k[len(prefix):]: reader.read(k) for k in reader.entries if k.startswith(prefix)
               and not k.startswith("model.") and not k.startswith("text_encoders.")}
    for old, new in (("encoder.quant_conv.", "quant_conv."),
                     ("decoder.post_quant_conv.", "post_quant_conv.")):  # BFL's own names
        tensors.update({new + k[len(old):]: tensors.pop(k) for k in list(tensors)
                        if k.startswith(old)})
    config = _config(root, "vae")
    try:
        module = AutoencoderKLFlux2.from_config(config)
        state = convert_ldm_vae_checkpoint({k: v for k, v in tensors.items()
                                            if not k.startswith("bn.")}, config)
        state.update({k: v for k, v in tensors.items() if k.startswith("bn.")})
        module.load_state_dict(state, strict=True)
    except Exception as exc:  # noqa: BLE001 - names, shapes
        raise fail(where, "vae", exc) from None
    return module.to(dtype).eval()


def part_file(setting: str, value: Optional[str], what: str) -> Path:
    if not value:
        raise ModelLoadError(f"{FIELD} holds the FLUX.2 transformer without its {what}: set "
                             f"{setting} to {FILES[setting]}")
    found = Path(value).expanduser()
    if not found.is_file():
        raise ModelLoadError(f"{setting} = {value!r}: no such file; point it at "
                             f"{FILES[setting]}")
    return found


def _root(section: Any, variant: str) -> Path:
    from trainer.families import spec

    if section.config_dir:
        return Path(section.config_dir).expanduser()
    return spec("flux2").assets(variant)


def load_single_file(path: Path, section: Any, *, dtype: Any = None, text_frozen: bool = False,
                     defer_denoiser: bool = False, fresh: bool = True) -> dict[str, Any]:
    """The BaseModel fields of a FLUX.2 file and the part files its settings name."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from trainer.families.common.files import read_safetensors_header
    from trainer.families.common.qwen_tokenizers import load_qwen_tokenizer
    from trainer.families.flux2.mistral import build_mistral

    dtype = dtype or torch.float32
    info = header_info(read_safetensors_header(path).tensors)
    if info is None:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: no FLUX.2 transformer in it")
    if section.vae:
        raise ModelLoadError(f"model.vae is set, but {FIELD} is a FLUX.2 file: name its "
                             f"autoencoder with model.ae")
    variant = with_base(info.variant, base_from_name(path))
    root = _root(section, variant)
    vae_file = path if "vae" in info.parts_inside else part_file("model.ae", section.ae, "VAE")
    text_file = path if "qwen3" in info.parts_inside else \
        part_file("model.text_encoder", section.text_encoder, "text encoder")
    fp8 = fresh and section.base_precision == "fp8"
    build = lambda d: build_transformer(path, info, root, d, fp8)  # noqa: E731
    text_setting = "model.text_encoder" if text_file != path else FIELD
    fp8_text = fresh and section.fp8_text_encoders and text_frozen
    dev = variant == "dev"
    text_encoder = build_mistral(text_file, text_setting, root, dtype, fp8_text, text_frozen) \
        if dev else build_text_encoder(text_file, text_setting, root, dtype, fp8_text)
    return dict(
        denoiser=None if defer_denoiser else build(dtype),
        build_denoiser=build if defer_denoiser else None,
        vae=build_vae(vae_file, "model.ae" if vae_file != path else FIELD, root, dtype),
        text_encoder=text_encoder,
        tokenizer=load_qwen_tokenizer("mistral3" if dev else "qwen3", section.tokenizer,
                                      [text_file, path]),
        noise_scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(
            str(root / "scheduler"), local_files_only=True),
        version="flux2", variant=variant, prediction_type="flow", source=str(path),
        name=path.stem, description=f"{LABELS[variant]} ({info.dtype} weights, {info.layout} "
                                    f"layout)",
        t5_max_length=MAX_SEQUENCE_LENGTH)
