"""Z-Image as one file in the original (ComfyUI native) layout: what DreamBooth and ``merge``
write, what Comfy-Org ships (``z_image_turbo_bf16.safetensors``: the transformer alone, bare keys)
and, with every part, ComfyUI's all-in-one form (``model.diffusion_model.``, ``vae.``,
``text_encoders.qwen3_4b.transformer.``).

The transformer's names are the inverse of ComfyUI's ``comfy/utils.py`` ``z_image_to_diffusers``
(which diffusers' ``convert_z_image_transformer_checkpoint_to_diffusers`` reads back): q, k, v
fused into ``attention.qkv`` (rows in that order), ``attention.to_out.0`` -> ``attention.out``,
``attention.norm_q/norm_k`` -> ``attention.q_norm/k_norm``, ``all_x_embedder.2-1`` ->
``x_embedder``, ``all_final_layer.2-1`` -> ``final_layer``; the rest as diffusers names it. The
VAE is FLUX.1's, in the original (LDM) names; Qwen3 in transformers' names under ``model.``, as
Comfy-Org's ``qwen_3_4b.safetensors``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import unwrap
from trainer.families.common.mmdit_checkpoint import vae_tensors
from trainer.system.safe_write import save_safetensors_atomic

DIT = "model.diffusion_model."
VAE = "vae."
TEXT = "text_encoders.qwen3_4b.transformer."
RENAMES = ((".attention.to_out.0.", ".attention.out."),
           (".attention.norm_q.", ".attention.q_norm."),
           (".attention.norm_k.", ".attention.k_norm."))
PREFIXES = (("all_x_embedder.2-1.", "x_embedder."), ("all_final_layer.2-1.", "final_layer."))


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() if v.is_meta else v.detach().to("cpu")
            for k, v in unwrap(module).state_dict().items()}


def native_name(key: str) -> str:
    """A diffusers key's native name (the q/k/v parts are fused by :func:`native_tensors`)."""
    for old, new in PREFIXES:
        if key.startswith(old):
            return new + key[len(old):]
    for old, new in RENAMES:
        key = key.replace(old, new)
    return key


def native_tensors(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A ``ZImageTransformer2DModel`` in the native layout (bare keys)."""
    sd, out = _weights(transformer), {}
    for key in [k for k in sd if ".attention.to_q." in k]:
        block, end = key.split(".attention.to_q.")
        parts = [sd.pop(f"{block}.attention.to_{p}.{end}") for p in "qkv"]
        out[f"{block}.attention.qkv.{end}"] = torch.cat(parts, dim=0)
    out.update((native_name(k), v) for k, v in sd.items())
    return out


def qwen3_tensors(text_encoder: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """A transformers ``Qwen3Model`` as Comfy-Org's ``qwen_3_4b.safetensors`` names it."""
    return {f"{prefix}model.{k}": v for k, v in _weights(text_encoder).items()}


def state_dict(components: Mapping[str, Any], parts: Iterable[str] = ("transformer",)
               ) -> dict[str, torch.Tensor]:
    """The tensors of ``parts`` (``transformer``, ``vae``, ``qwen3``): the transformer alone
    bare, with other parts ComfyUI's all-in-one prefixes."""
    parts = list(parts)
    if "transformer" not in parts or set(parts) - {"transformer", "vae", "qwen3"}:
        raise ValueError(f"parts {parts}: a Z-Image file holds the transformer and any of "
                         f"vae, qwen3")
    bare = parts == ["transformer"]
    out = {("" if bare else DIT) + k: v
           for k, v in native_tensors(components["transformer"]).items()}
    if "vae" in parts:
        out.update(vae_tensors(components["vae"], VAE))
    if "qwen3" in parts:
        out.update(qwen3_tensors(components["text_encoder"], TEXT))
    return out


def save_checkpoint(path: str | Path, components: Mapping[str, Any],
                    metadata: Optional[Mapping[str, str]] = None, *,
                    parts: Optional[Iterable[str]] = None, variant: str = "turbo",
                    dtype: Optional[torch.dtype] = torch.bfloat16) -> Path:
    """Write ``components`` (``ZImagePipeline``'s names) as one native-layout file, atomically,
    floating tensors cast to ``dtype`` (None keeps the model's)."""
    tensors = state_dict(components, parts or ("transformer",))
    for key, tensor in tensors.items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[key] = tensor.contiguous()
    meta = {"modelspec.sai_model_spec": "1.0.1", "modelspec.architecture": f"z-image-{variant}",
            "modelspec.implementation": "https://github.com/Tongyi-MAI/Z-Image",
            "modelspec.title": Path(path).stem,
            "modelspec.date": datetime.datetime.now().replace(microsecond=0).isoformat()}
    meta.update(metadata or {})
    return save_safetensors_atomic(path, tensors, meta)
