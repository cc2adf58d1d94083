"""FLUX.1's layers as the tools (inspect, merge, resize, extract) name them: sd-scripts' kohya
names on Black Forest Labs' layout (``lora_unet_double_blocks_0_img_attn_qkv``), a fused layer
being several diffusers layers in row order (the target's ``pieces``); CLIP-L ``lora_te1_`` and
T5 ``lora_te3_`` (the pipeline's ``text_encoder_2``). See :mod:`trainer.tools.flow_targets`."""

from __future__ import annotations

from typing import Any

import torch

from trainer.export.names import kohya_module_name
from trainer.families.flux.lora import flux_part_modules
from trainer.tools.flow_targets import group
from trainer.tools.targets import Target, encoder_targets

BLOCK_PREFIXES = ("lora_unet_double_blocks_", "lora_unet_single_blocks_")  # its files' blocks
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = True  # its LoRA may train T5 (trainer/families/flux/lora.py)


def _as_is(path: str) -> str:
    return path


def kohya_targets(transformer: torch.nn.Module, in_dims: bool = True) -> list[Target]:
    """The BFL-named targets of sd-scripts' FLUX.1 LoRA (``in_dims``: with the embedders)."""
    return [group(transformer, kohya_module_name("lora_unet", bfl), paths)
            for bfl, paths in flux_part_modules(transformer, in_dims=in_dims).items()]


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The transformer layers the family's LoRA trains: the double and single blocks'."""
    return kohya_targets(transformer, in_dims=False)


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """CLIP-L (``lora_te1_``, also ``lora_te_``) and T5 (``lora_te3_``)."""
    return (encoder_targets(model.text_encoder, "lora_te1", "te1", aliases=["lora_te"])
            + encoder_targets(model.text_encoder_2, "lora_te3", "te3", rename=_as_is))
