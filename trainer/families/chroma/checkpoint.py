"""Chroma as a single file in Black Forest Labs' layout, as DreamBooth and ``merge`` write it.

diffusers reads this layout (``convert_chroma_transformer_checkpoint_to_diffusers``); this
module writes it from the model's own modules, FLUX.1's names
(:mod:`trainer.families.common.mmdit_checkpoint`) without its modulation layers, plus the
approximator: ``distilled_guidance_layer.layers.N.linear_1`` / ``linear_2`` ->
``.in_layer`` / ``.out_layer``, its RMS norms' weights as ``norms.N.scale``; the attention
projections fused back (``img_attn.qkv``, ``txt_attn.qkv``, ``linear1``); Chroma's last
layer has no modulation of its own (``final_layer.linear`` only).

The shipped form is the transformer alone with bare keys (``Chroma1-HD.safetensors``); asked for
more parts, the whole checkpoint ComfyUI's ``Chroma`` model reads: ``model.diffusion_model.``,
the VAE under ``first_stage_model.`` and T5 under ``cond_stage_model.t5xxl.transformer.``
(ComfyUI's default prefixes, which its Chroma keeps).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.metadata import SPEC_VERSION
from trainer.export.names import unwrap
from trainer.families.common.mmdit_checkpoint import (
    DIT,
    FLUX_DOUBLE,
    FLUX_DOUBLE_NORMS,
    _fuse,
    _leftover,
    _move,
    _weights,
    t5_tensors,
    vae_tensors,
)
from trainer.system.safe_write import save_safetensors_atomic

PREFIXES = {"vae": "first_stage_model.", "t5xxl": "cond_stage_model.t5xxl.transformer."}
COMPONENT = {"vae": "vae", "t5xxl": "text_encoder"}
ARCHITECTURE = "chroma"  # sd-scripts' sai_model_spec ARCH_FLUX_1_CHROMA
IMPLEMENTATION = "https://huggingface.co/lodestones/Chroma"  # sd-scripts' IMPL_CHROMA
FIXED = (("context_embedder", "txt_in"), ("x_embedder", "img_in"),
         ("proj_out", "final_layer.linear"),
         ("distilled_guidance_layer.in_proj", "distilled_guidance_layer.in_proj"),
         ("distilled_guidance_layer.out_proj", "distilled_guidance_layer.out_proj"))
MODULATIONS = ("norm1.linear", "norm1_context.linear")  # FLUX.1's, which Chroma's blocks lack


def chroma_tensors(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A diffusers ChromaTransformer2DModel in BFL's layout (bare keys)."""
    sd, out = _weights(transformer), {}
    config = unwrap(transformer).config
    for src, dst in FIXED:
        _move(sd, out, src, dst)
    for i in range(config.approximator_layers):
        src = dst = f"distilled_guidance_layer.layers.{i}."
        _move(sd, out, src + "linear_1", dst + "in_layer")
        _move(sd, out, src + "linear_2", dst + "out_layer")
        _move(sd, out, f"distilled_guidance_layer.norms.{i}",
              f"distilled_guidance_layer.norms.{i}", "scale")
    for i in range(config.num_layers):
        src, dst = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for a, b in FLUX_DOUBLE:
            if a not in MODULATIONS:
                _move(sd, out, src + a, dst + b)
        for a, b in FLUX_DOUBLE_NORMS:
            _move(sd, out, src + a, dst + b, "scale")
        _fuse(sd, out, [src + f"attn.to_{p}" for p in "qkv"], dst + "img_attn.qkv")
        _fuse(sd, out, [src + f"attn.add_{p}_proj" for p in "qkv"], dst + "txt_attn.qkv")
    for i in range(config.num_single_layers):
        src, dst = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        _move(sd, out, src + "proj_out", dst + "linear2")
        _move(sd, out, src + "attn.norm_q", dst + "norm.query_norm", "scale")
        _move(sd, out, src + "attn.norm_k", dst + "norm.key_norm", "scale")
        _fuse(sd, out, [src + f"attn.to_{p}" for p in "qkv"] + [src + "proj_mlp"], dst + "linear1")
    _leftover(sd, "BFL's Chroma layout")
    return out


def chroma_state_dict(components: Mapping[str, Any], parts: Optional[Iterable[str]] = None
                      ) -> dict[str, torch.Tensor]:
    """The tensors of ``parts`` (default: the transformer alone, bare) in the original layout;
    with the VAE or T5, the whole checkpoint's prefixes (see the module's notes)."""
    parts = list(parts or ("transformer",))
    unknown = [p for p in parts if p != "transformer" and p not in PREFIXES]
    if unknown or "transformer" not in parts:
        raise ValueError(f"parts {parts}: a Chroma file holds the transformer and any of "
                         f"{sorted(PREFIXES)}")
    bare = parts == ["transformer"]
    out = {("" if bare else DIT) + k: v
           for k, v in chroma_tensors(components["transformer"]).items()}
    if "vae" in parts:
        out.update(vae_tensors(components[COMPONENT["vae"]], PREFIXES["vae"]))
    if "t5xxl" in parts:
        out.update(t5_tensors(components[COMPONENT["t5xxl"]], PREFIXES["t5xxl"]))
    return out


def modelspec(title: str, resolution: int = 1024) -> dict[str, str]:
    """sai_model_spec keys of a base model, as sd-scripts writes them for Chroma."""
    return {"modelspec.sai_model_spec": SPEC_VERSION, "modelspec.architecture": ARCHITECTURE,
            "modelspec.implementation": IMPLEMENTATION, "modelspec.title": title,
            "modelspec.resolution": f"{resolution}x{resolution}",
            "modelspec.date": datetime.datetime.now().replace(microsecond=0).isoformat()}


def save_checkpoint(path: str | Path, components: Mapping[str, Any],
                    metadata: Optional[Mapping[str, str]] = None, *,
                    parts: Optional[Iterable[str]] = None, variant: str = "hd",
                    dtype: Optional[torch.dtype] = torch.bfloat16) -> Path:
    """Write ``components`` (ChromaPipeline's names; ``text_encoder`` is T5) as one file,
    atomically, with ``modelspec.*`` metadata; floating tensors cast to ``dtype`` (``None``
    keeps the model's, ``torch.float8_e4m3fn`` writes an fp8 file). One layout for every
    ``variant``."""
    tensors = chroma_state_dict(components, parts)
    for key, tensor in tensors.items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[key] = tensor.contiguous()
    meta = modelspec(Path(path).stem)
    meta.update(metadata or {})
    return save_safetensors_atomic(path, tensors, meta)
