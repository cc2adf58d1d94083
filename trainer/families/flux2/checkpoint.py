"""FLUX.2 as one file in Black Forest Labs' layout: what DreamBooth and ``merge`` write, what BFL
ships (``flux-2-klein-4b.safetensors``: the transformer alone, bare keys) and, with every part,
ComfyUI's all-in-one form (``model.diffusion_model.``, ``vae.``,
``text_encoders.qwen3_4b.transformer.``; ``qwen3_8b`` for klein 9B; dev's Mistral-Small-3 under
``text_encoders.mistral3_24b.transformer.`` in ComfyUI's names, :mod:`.mistral`).

The transformer's names are the inverse of diffusers' ``convert_flux2_transformer_checkpoint_to_
diffusers`` (which reads them back): q, k, v fused into ``double_blocks.N.img_attn.qkv`` (the
text stream's ``add_*_proj`` into ``txt_attn.qkv``), ``norm_q`` -> ``norm.query_norm.scale``,
``ff.linear_in`` -> ``img_mlp.0``, ``attn.to_qkv_mlp_proj`` -> ``single_blocks.N.linear1``,
``attn.to_out`` -> ``linear2``, ``.linear`` of the shared modulations -> ``.lin``, the embedders
``img_in`` / ``txt_in`` / ``time_in`` / ``guidance_in``, ``proj_out`` -> ``final_layer.linear``
and ``norm_out.linear`` -> ``final_layer.adaLN_modulation.1`` with its (scale, shift) halves
swapped back to BFL's (shift, scale). The VAE in the original (LDM) names with its BatchNorm
statistics (``bn.running_mean`` / ``bn.running_var``, as ComfyUI reads ``flux2-vae``); Qwen3 in
transformers' names (``model.layers...``), as Comfy-Org's ``qwen_3_4b.safetensors``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import unwrap
from trainer.families.common.mmdit_checkpoint import vae_tensors as ldm_vae_tensors
from trainer.system.safe_write import save_safetensors_atomic

DIT = "model.diffusion_model."
VAE = "vae."
TEXT = {"klein-9b": "text_encoders.qwen3_8b.transformer."}
TEXT_DEFAULT = "text_encoders.qwen3_4b.transformer."
PREFIXES = (("x_embedder.", "img_in."), ("context_embedder.", "txt_in."),
            ("time_guidance_embed.timestep_embedder.linear_1.", "time_in.in_layer."),
            ("time_guidance_embed.timestep_embedder.linear_2.", "time_in.out_layer."),
            ("time_guidance_embed.guidance_embedder.linear_1.", "guidance_in.in_layer."),
            ("time_guidance_embed.guidance_embedder.linear_2.", "guidance_in.out_layer."),
            ("double_stream_modulation_img.linear.", "double_stream_modulation_img.lin."),
            ("double_stream_modulation_txt.linear.", "double_stream_modulation_txt.lin."),
            ("single_stream_modulation.linear.", "single_stream_modulation.lin."),
            ("proj_out.", "final_layer.linear."))
DOUBLE = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale",
          "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
          "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
          "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
          "attn.to_out.0.": "img_attn.proj.", "attn.to_add_out.": "txt_attn.proj.",
          "ff.linear_in.": "img_mlp.0.", "ff.linear_out.": "img_mlp.2.",
          "ff_context.linear_in.": "txt_mlp.0.", "ff_context.linear_out.": "txt_mlp.2."}
SINGLE = {"attn.to_qkv_mlp_proj.": "linear1.", "attn.to_out.": "linear2.",
          "attn.norm_q.weight": "norm.query_norm.scale",
          "attn.norm_k.weight": "norm.key_norm.scale"}
QKV = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
       "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() if v.is_meta else v.detach().to("cpu")
            for k, v in unwrap(module).state_dict().items()}


def _block_name(rest: str, table: Mapping[str, str]) -> str:
    for old, new in table.items():
        if rest.startswith(old):
            return new + rest[len(old):]
    raise ValueError(f"transformer weight {rest!r} has no place in FLUX.2's BFL layout")


def bfl_name(key: str) -> str:
    """A diffusers key's BFL name (the q/k/v parts are fused by :func:`bfl_tensors`)."""
    for old, new in PREFIXES:
        if key.startswith(old):
            return new + key[len(old):]
    if key.startswith("transformer_blocks."):
        _, n, rest = key.split(".", 2)
        return f"double_blocks.{n}.{_block_name(rest, DOUBLE)}"
    if key.startswith("single_transformer_blocks."):
        _, n, rest = key.split(".", 2)
        return f"single_blocks.{n}.{_block_name(rest, SINGLE)}"
    raise ValueError(f"transformer weight {key!r} has no place in FLUX.2's BFL layout")


def bfl_tensors(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A ``Flux2Transformer2DModel`` in BFL's layout (bare keys)."""
    sd, out = _weights(transformer), {}
    for n in sorted({k.split(".")[1] for k in sd if k.startswith("transformer_blocks.")}):
        for fused, parts in QKV.items():
            block = f"transformer_blocks.{n}."
            out[f"double_blocks.{n}.{fused}.weight"] = torch.cat(
                [sd.pop(f"{block}{p}.weight") for p in parts], dim=0)
    norm = sd.pop("norm_out.linear.weight")
    scale, shift = norm.chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale], dim=0)
    out.update((bfl_name(k), v) for k, v in sd.items())
    return out


def vae_tensors(vae: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """``AutoencoderKLFlux2`` in the original names: the KL autoencoder's LDM names and the
    BatchNorm's statistics (``bn.*``)."""
    vae = unwrap(vae)
    plain = torch.nn.Module()
    for name in ("encoder", "decoder", "quant_conv", "post_quant_conv"):
        if getattr(vae, name, None) is not None:
            setattr(plain, name, getattr(vae, name))
    plain.config = vae.config
    out = ldm_vae_tensors(plain, prefix)
    out.update((f"{prefix}bn.{k}", v.detach().cpu()) for k, v in vae.bn.state_dict().items())
    return out


def qwen3_tensors(text_encoder: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Qwen3 in transformers' names as Comfy-Org's ``qwen_3_4b.safetensors`` (``model.*``; a
    ``Qwen3ForCausalLM``'s tied ``lm_head`` left out, as there)."""
    sd = _weights(text_encoder)
    tied = getattr(unwrap(text_encoder).config, "tie_word_embeddings", False)
    return {prefix + k: v for k, v in sd.items() if not (tied and k == "lm_head.weight")}


def mistral_tensors(text_encoder: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """dev's ``Mistral3ForConditionalGeneration`` in ComfyUI's names (:mod:`.mistral`)."""
    from trainer.families.flux2.mistral import to_comfy

    return {prefix + to_comfy(k): v for k, v in _weights(text_encoder).items()}


def state_dict(components: Mapping[str, Any], parts: Iterable[str] = ("transformer",),
               variant: str = "klein-4b") -> dict[str, torch.Tensor]:
    """The tensors of ``parts`` (``transformer``, ``vae``, ``qwen3``): the transformer alone
    bare, with other parts ComfyUI's all-in-one prefixes."""
    parts = list(parts)
    if "transformer" not in parts or set(parts) - {"transformer", "vae", "qwen3"}:
        raise ValueError(f"parts {parts}: a FLUX.2 file holds the transformer and any of "
                         f"vae, qwen3")
    bare = parts == ["transformer"]
    out = {("" if bare else DIT) + k: v
           for k, v in bfl_tensors(components["transformer"]).items()}
    if "vae" in parts:
        out.update(vae_tensors(components["vae"], VAE))
    if "qwen3" in parts and variant == "dev":
        from trainer.families.flux2.mistral import PREFIX

        out.update(mistral_tensors(components["text_encoder"], PREFIX))
    elif "qwen3" in parts:
        text = TEXT.get(variant.replace("base-", ""), TEXT_DEFAULT)
        out.update(qwen3_tensors(components["text_encoder"], text))
    return out


def save_checkpoint(path: str | Path, components: Mapping[str, Any],
                    metadata: Optional[Mapping[str, str]] = None, *,
                    parts: Optional[Iterable[str]] = None, variant: str = "klein-4b",
                    dtype: Optional[torch.dtype] = torch.bfloat16) -> Path:
    """Write ``components`` (``Flux2KleinPipeline``'s names) as one BFL-layout file,
    atomically, floating tensors cast to ``dtype`` (None keeps the model's)."""
    tensors = state_dict(components, parts or ("transformer",), variant or "klein-4b")
    for key, tensor in tensors.items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[key] = tensor.contiguous()
    meta = {"modelspec.sai_model_spec": "1.0.1",
            "modelspec.architecture": f"flux-2-{variant or 'klein-4b'}",
            "modelspec.implementation": "https://github.com/black-forest-labs/flux2",
            "modelspec.title": Path(path).stem,
            "modelspec.date": datetime.datetime.now().replace(microsecond=0).isoformat()}
    meta.update(metadata or {})
    return save_safetensors_atomic(path, tensors, meta)
