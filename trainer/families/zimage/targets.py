"""Z-Image's layers as the tools (inspect, merge, resize, extract) name them (see
:mod:`trainer.tools.flow_targets`):

- the names our files and ComfyUI's native form give them: ``lora_unet_layers_0_attention_qkv``
  (q, k, v fused, in row order), ``..._attention_out``, ``..._feed_forward_w1``, for the main
  layers and the refiners;
- musubi-tuner's kohya names on diffusers' modules (``lora_unet_layers_0_attention_to_q``,
  ``..._to_out_0``);
- diffusers' and ai-toolkit's peft form (``transformer.layers.0.attention.to_q.lora_A.weight``,
  ``diffusion_model.layers.0...``), read as ``lora_transformer_<diffusers path>``.

Its LoRA trains no text encoder (Qwen3): no ``lora_te`` names.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.export.names import kohya_module_name
from trainer.families.zimage.lora import BLOCKS, TRAINED_BLOCKS, UNET_PREFIX, part_modules
from trainer.tools.flow_targets import group
from trainer.tools.targets import Target

LABEL = "Z-Image"
BLOCK_PREFIXES = tuple(f"{UNET_PREFIX}_{b}_" for b in BLOCKS)  # its files' blocks
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = False


def kohya_targets(transformer: torch.nn.Module, blocks: tuple[str, ...] = BLOCKS
                  ) -> list[Target]:
    """The native names (fused qkv) and musubi-tuner's names of each split layer."""
    out = []
    for native, paths in part_modules(transformer, blocks).items():
        out.append(group(transformer, kohya_module_name(UNET_PREFIX, native), paths))
        if len(paths) > 1 or not paths[0].endswith(native.split(".", 2)[2]):
            out += [group(transformer, kohya_module_name(UNET_PREFIX, p), (p,)) for p in paths]
    return out


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The layers the family's LoRA trains, under the names its files give them."""
    return [group(transformer, kohya_module_name(UNET_PREFIX, native), paths)
            for native, paths in part_modules(transformer, TRAINED_BLOCKS).items()]


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    return []
