"""Chroma's layers as the tools (inspect, merge, resize, extract) name them, in the forms the
peers write (see :mod:`trainer.tools.flow_targets`):

- sd-scripts (``networks/lora_flux.py``, ``--model_type chroma``) and this studio: kohya names
  on Black Forest Labs' layout, ``lora_unet_double_blocks_0_img_attn_qkv``, a fused layer being
  several diffusers layers in row order (the target's ``pieces``); T5 as ``lora_te1_`` (ours,
  ComfyUI's) or ``lora_te3_`` (sd-scripts');
- diffusers / SimpleTuner: ``transformer.<diffusers path>`` (the tools' ``lora_transformer_``);
- ai-toolkit: ``diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight`` (peft suffixes on
  BFL paths; read as ``lora_unet_`` + the path, the same layer as sd-scripts' name).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.export.names import kohya_module_name
from trainer.families.chroma.lora import SD_SCRIPTS_T5_PREFIX, T5_PREFIX, UNET_PREFIX, part_modules
from trainer.tools.flow_targets import bfl_gated_mlp, bfl_modulated, group
from trainer.tools.targets import Target, encoder_targets

BLOCK_PREFIXES = ("lora_unet_double_blocks_", "lora_unet_single_blocks_")  # its files' blocks
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = True  # its LoRA may train T5 (trainer/families/chroma/lora.py)
LABEL = "Chroma"


def _as_is(path: str) -> str:
    return path


def kohya_targets(transformer: torch.nn.Module, in_dims: bool = True) -> list[Target]:
    """The BFL-named targets of sd-scripts' Chroma LoRA (``in_dims``: with the embedders)."""
    return [group(transformer, kohya_module_name(UNET_PREFIX, bfl), paths)
            for bfl, paths in part_modules(transformer, in_dims=in_dims).items()]


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The transformer layers the family's LoRA trains: the double and single blocks'."""
    return kohya_targets(transformer, in_dims=False)


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """T5 (the pipeline's ``text_encoder``): ``lora_te1_``, also sd-scripts' ``lora_te3_``."""
    return encoder_targets(model.text_encoder, T5_PREFIX, "te3", rename=_as_is,
                           aliases=[SD_SCRIPTS_T5_PREFIX])


def tells(modules: dict[str, Any]) -> Optional[str]:
    """Why a file of BFL block names is Chroma's, or None: its blocks have no modulation layer
    (FLUX.1's do, and its LoRA trains them: sd-scripts', this studio's) and a plain MLP (not
    FLUX.2's gated one). The diffusers form's names are FLUX.1's: only metadata tells it."""
    if not any(n.startswith(BLOCK_PREFIXES) for n in modules) or bfl_modulated(modules):
        return None
    if bfl_gated_mlp(modules) is not False:
        return None
    return "block names without FLUX.1's modulation layers"
