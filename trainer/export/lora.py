"""LoRA weights from peft layers to kohya's key names, and the LoRA file itself.

A kohya LoRA file holds, for every adapted module, three tensors::

    lora_unet_<module path, '.' -> '_'>.lora_down.weight   peft's lora_A  [r, in] or [r, in, k, k]
    lora_unet_<module path, '.' -> '_'>.lora_up.weight     peft's lora_B  [out, r] or [out, r, 1, 1]
    lora_unet_<module path, '.' -> '_'>.alpha              a 0-d tensor, the LoRA alpha

and the update is ``up @ down * alpha / r``, which is peft's ``lora_alpha / r`` scaling. The
UNet's module paths are diffusers' (sd-scripts trains SD 1.x/2.x LoRA on a UNet with diffusers'
names); the SD 1.x/2.x text encoder is ``lora_te_text_model_encoder_layers_<i>_...``, the names
AUTOMATIC1111, ComfyUI and diffusers' ``load_lora_weights`` read.

diffusers ships ``convert_state_dict_to_kohya``, but it writes ``alpha = rank`` (so a LoRA
trained with alpha != rank loads at the wrong strength) and names the text encoder ``lora_te1_``;
this converter reads each peft layer's own rank and alpha instead, which also covers
``rank_pattern`` / ``alpha_pattern`` (e.g. conv LoRA with its own rank).

SDXL: the text encoders are ``lora_te1_...`` and ``lora_te2_...`` and the UNet's modules are
named by the original SGM layout (``lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q``),
as sd-scripts' SDXL networks name them; :func:`sgm_unet_names` maps diffusers' paths.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import (  # noqa: F401 - the names this module writes with
    TEXT_ENCODER_PREFIX,
    UNET_PREFIX,
    kohya_module_name,
    text_encoder_module_path,
    unwrap,
)

SAVE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def iter_lora_layers(model: torch.nn.Module, adapter_name: str = "default") -> Iterator[
        tuple[str, Any]]:
    """(module path, peft LoraLayer) of every layer that carries ``adapter_name``."""
    from peft.tuners.lora import LoraLayer

    for name, module in unwrap(model).named_modules():
        if isinstance(module, LoraLayer) and adapter_name in module.lora_A:
            yield name, module


def layer_alpha(layer: Any, adapter_name: str = "default") -> float:
    """The alpha that reproduces the layer's scaling under kohya's ``alpha / r`` rule.

    That is peft's ``lora_alpha`` for plain LoRA; with rsLoRA (``alpha / sqrt(r)``) it is the
    alpha that gives the same update, ``scaling * r``.
    """
    r = layer.r[adapter_name]
    alpha = float(layer.lora_alpha[adapter_name])
    scaling = float(layer.scaling[adapter_name])
    return alpha if math.isclose(scaling, alpha / r, rel_tol=1e-6) else scaling * r


def _check_exportable(name: str, layer: Any, adapter_name: str) -> None:
    if getattr(layer, "use_dora", {}).get(adapter_name, False):
        raise NotImplementedError(f"{name}: DoRA layers have no kohya LoRA form here")
    if getattr(layer, "lora_bias", {}).get(adapter_name, False):
        raise NotImplementedError(f"{name}: lora_bias has no kohya LoRA form")


def _to_save(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=dtype).clone().contiguous()


def module_lora_tensors(
    model: torch.nn.Module,
    prefix: str,
    *,
    dtype: torch.dtype = torch.float16,
    adapter_name: str = "default",
    rename: Optional[Any] = None,
) -> dict[str, torch.Tensor]:
    """The kohya tensors of one model's peft adapter; ``rename`` maps module paths first."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in iter_lora_layers(model, adapter_name):
        _check_exportable(name, layer, adapter_name)
        key = kohya_module_name(prefix, rename(name) if rename else name)
        if key + ".alpha" in out:
            raise ValueError(f"two modules map to the same kohya name {key!r}")
        out[key + ".lora_down.weight"] = _to_save(layer.lora_A[adapter_name].weight, dtype)
        out[key + ".lora_up.weight"] = _to_save(layer.lora_B[adapter_name].weight, dtype)
        out[key + ".alpha"] = torch.tensor(layer_alpha(layer, adapter_name), dtype=dtype)
    return out


def kohya_state_dict(
    unet: Optional[torch.nn.Module],
    text_encoder: Optional[torch.nn.Module] = None,
    *,
    dtype: torch.dtype = torch.float16,
    te_prefix: str = TEXT_ENCODER_PREFIX,
    adapter_name: str = "default",
    text_encoder_2: Optional[torch.nn.Module] = None,
    unet_rename: Optional[Any] = None,
) -> dict[str, torch.Tensor]:
    """The LoRA of a peft-adapted UNet (and text encoder(s)) under kohya's key names.

    SDXL: pass ``te_prefix="lora_te1"``, ``text_encoder_2`` (named ``lora_te2``) and
    ``unet_rename`` = :func:`sgm_unet_names` (sd-scripts names SDXL's UNet modules by the
    original SGM layout, ``input_blocks_4_1_...``)."""
    tensors: dict[str, torch.Tensor] = {}
    if unet is not None:
        tensors.update(module_lora_tensors(unet, UNET_PREFIX, dtype=dtype,
                                           adapter_name=adapter_name, rename=unet_rename))
    for prefix, encoder in ((te_prefix, text_encoder), ("lora_te2", text_encoder_2)):
        if encoder is not None:
            tensors.update(module_lora_tensors(encoder, prefix, dtype=dtype,
                                               adapter_name=adapter_name,
                                               rename=text_encoder_module_path))
    if not tensors:
        raise ValueError(f"no LoRA layers with adapter {adapter_name!r} to save")
    return tensors


def sgm_unet_names(unet: torch.nn.Module) -> Any:
    """diffusers module path -> the original (SGM/LDM) one, for this UNet's config:
    ``down_blocks.1.attentions.0.proj_in`` -> ``input_blocks.4.1.proj_in`` (SDXL's layout)."""
    from trainer.families.sd.checkpoint import original_module_path, unet_prefix_map

    prefixes = unet_prefix_map(unwrap(unet).config)
    return lambda path: original_module_path(path, prefixes)


def save_lora(
    path: str | Path,
    unet: Optional[torch.nn.Module],
    text_encoder: Optional[torch.nn.Module],
    cfg: Any,
    facts: Any,
    dtype: Optional[torch.dtype] = None,
    text_encoder_2: Optional[torch.nn.Module] = None,
) -> Path:
    """Write a kohya LoRA file with ``ss_*``, ``modelspec.*`` and ``sshs_*`` metadata, atomically.

    ``dtype`` defaults to ``cfg.saving.save_precision``; ``facts`` is a
    :class:`trainer.export.metadata.RunFacts` for the moment of this save (steps, epoch, ...).
    """
    from trainer.export.hashes import add_hashes
    from trainer.export.metadata import RunFacts, build_lora_metadata, lora_naming, resolved_version
    from trainer.system.safe_write import save_safetensors_atomic

    facts = facts if facts is not None else RunFacts()
    dtype = dtype or SAVE_DTYPES[cfg.saving.save_precision]
    naming = lora_naming(resolved_version(cfg, facts))  # the family's kohya names
    prefixes = naming.TE_PREFIXES
    tensors = kohya_state_dict(
        unet, text_encoder, dtype=dtype, te_prefix=prefixes["text_encoder"],
        text_encoder_2=text_encoder_2 if "text_encoder_2" in prefixes else None,
        unet_rename=naming.unet_rename(unet) if unet else None)
    metadata = add_hashes(build_lora_metadata(cfg, facts), tensors)
    return save_safetensors_atomic(path, tensors, metadata)
