"""FLUX.2's layers as the tools (inspect, merge, resize, extract) name them (see
:mod:`trainer.tools.flow_targets`):

- the names our files and musubi-tuner's give them, BFL's in kohya form:
  ``lora_unet_double_blocks_0_img_attn_qkv`` (q, k, v fused, in row order),
  ``..._img_mlp_0`` (diffusers' ``ff.linear_in``), ``lora_unet_single_blocks_0_linear1``
  (``attn.to_qkv_mlp_proj``);
- diffusers' and ai-toolkit's peft form on diffusers' names
  (``transformer.transformer_blocks.0.attn.to_q.lora_A.weight``), read as
  ``lora_transformer_<diffusers path>``.

Its LoRA trains no text encoder (Qwen3): no ``lora_te`` names.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.export.names import kohya_module_name
from trainer.families.flux2.lora import UNET_PREFIX, part_modules
from trainer.tools.flow_targets import bfl_gated_mlp, group
from trainer.tools.targets import Target

LABEL = "FLUX.2"
# its kohya and ai-toolkit files name Black Forest Labs' blocks as FLUX.1's and Chroma's do: their
# MLP's shapes tell it (:func:`tells`); diffusers' form has layers no other family has
BLOCK_PREFIXES = ("lora_transformer_single_transformer_blocks_0_attn_to_qkv_mlp_proj",)
MARKERS = ("_attn_to_qkv_mlp_proj", "_ff_linear_in", "_ff_linear_out", "_ff_context_linear_")
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = False


def kohya_targets(transformer: torch.nn.Module) -> list[Target]:
    """The BFL kohya names of every block layer (fused qkv as its diffusers parts)."""
    return [group(transformer, kohya_module_name(UNET_PREFIX, name), paths)
            for name, paths in part_modules(transformer).items()]


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The layers the family's LoRA trains, under the names its files give them."""
    return kohya_targets(transformer)


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    return []


def tells(modules: dict[str, Any]) -> Optional[str]:
    """Why a file of BFL block names is FLUX.2's (its gated MLP's shapes), or None."""
    return "block names with a gated MLP (FLUX.2's shapes)" if bfl_gated_mlp(modules) else None
