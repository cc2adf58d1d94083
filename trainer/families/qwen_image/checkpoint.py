"""Qwen-Image as single files in the layouts ComfyUI loads, and the DreamBooth file.

- **Transformer**: the original names are diffusers' own (ComfyUI's native Qwen-Image keys are
  the diffusers keys; diffusers' ``from_single_file`` maps them with an identity), bare as
  Comfy-Org's ``qwen_image_bf16.safetensors`` holds them, or under ``model.diffusion_model.``
  in an all-in-one file.
- **VAE**: the Wan 2.1 layout (``encoder.downsamples.N.residual.0.gamma``, ``decoder.upsamples``,
  ``conv1`` / ``conv2`` for the quant convs), as ``qwen_image_vae.safetensors`` holds it and
  diffusers' ``convert_wan_vae_to_diffusers`` reads it; :func:`wan_vae_name` is that converter's
  inverse (the tests hold the round trip to it). ``vae.`` in an all-in-one file.
- **Text encoder**: Qwen2.5-VL in the names of its released checkpoint (``model.layers.*``,
  ``visual.blocks.*``, ``lm_head.weight``: transformers' ``revert_weight_conversion``, what its
  ``save_pretrained`` writes and ComfyUI's detector reads, ``model.layers.0.self_attn.k_proj
  .bias``), under ``text_encoders.qwen25_7b.transformer.`` in an all-in-one file.

DreamBooth writes the transformer alone (the shipped form) or, when the text encoder trained,
the all-in-one form with every part (ComfyUI's checkpoint prefixes for Qwen-Image).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import unwrap
from trainer.families.qwen_image.layout import DIT, TEXT, VAE, wan_vae_name

PARTS = ("transformer", "vae", "qwen25_7b")
ARCHITECTURE = "qwen-image"
def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu") for k, v in unwrap(module).state_dict().items()}


def vae_tensors(vae: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The VAE in the Wan 2.1 layout under ``prefix``."""
    blocks = unwrap(vae).config.num_res_blocks
    return {prefix + wan_vae_name(k, blocks): v for k, v in _weights(vae).items()}


def text_encoder_tensors(encoder: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Qwen2.5-VL in its checkpoint's names under ``prefix``."""
    from transformers.core_model_loading import revert_weight_conversion

    return {prefix + k: v for k, v in revert_weight_conversion(
        unwrap(encoder), _weights(encoder)).items()}


def qwen_state_dict(components: Mapping[str, Any], parts: Optional[Iterable[str]] = None
                    ) -> dict[str, torch.Tensor]:
    """The tensors of ``parts`` (default: the transformer alone, bare keys)."""
    parts = list(parts or ("transformer",))
    if "transformer" not in parts or set(parts) - set(PARTS):
        raise ValueError(f"parts {parts}: a Qwen-Image file holds the transformer and any of "
                         f"{PARTS[1:]}")
    bare = parts == ["transformer"]
    out = {("" if bare else DIT) + k: v for k, v in _weights(components["transformer"]).items()}
    if "vae" in parts:
        out.update(vae_tensors(components["vae"], VAE))
    if "qwen25_7b" in parts:
        out.update(text_encoder_tensors(components["text_encoder"], TEXT))
    return out


def save_checkpoint(path: str | Path, components: Mapping[str, Any],
                    metadata: Optional[Mapping[str, str]] = None, *,
                    parts: Optional[Iterable[str]] = None, variant: str = "base",
                    dtype: Optional[torch.dtype] = torch.bfloat16) -> Path:
    """Write ``components`` (QwenImagePipeline's names) as one file, atomically, with
    ``modelspec.*`` metadata; floating tensors cast to ``dtype`` (None keeps them)."""
    from trainer.export.metadata import SPEC_VERSION
    from trainer.system.safe_write import save_safetensors_atomic

    tensors = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
               .contiguous() for k, v in qwen_state_dict(components, parts).items()}
    meta = {"modelspec.sai_model_spec": SPEC_VERSION, "modelspec.architecture": ARCHITECTURE,
            "modelspec.implementation": "https://github.com/QwenLM/Qwen-Image",
            "modelspec.title": Path(path).stem, "modelspec.resolution": "1328x1328",
            "modelspec.date": datetime.datetime.now().replace(microsecond=0).isoformat()}
    meta.update(metadata or {})
    return save_safetensors_atomic(path, tensors, meta)
