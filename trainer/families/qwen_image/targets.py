"""Qwen-Image's layers as the tools (inspect, merge, resize, extract) name them: the kohya form
this studio and musubi-tuner write (``lora_unet_transformer_blocks_0_attn_to_q``: ``lora_unet_``
+ the diffusers path, underscored, the path being ComfyUI's native name too). ai-toolkit's
``diffusion_model.<path>.lora_A/B`` files read under the same names (``diffusion_model.`` is
``lora_unet_``'s dotted twin, :mod:`trainer.tools.lora_file`), and diffusers' example's
``transformer.<path>`` files under ``lora_transformer_<path>``. Nothing is fused. See
:mod:`trainer.tools.flow_targets`."""

from __future__ import annotations

from typing import Any

import torch

from trainer.export.names import kohya_module_name, unwrap
from trainer.families.qwen_image.lora import qwen_target_modules
from trainer.tools.flow_targets import TRANSFORMER
from trainer.tools.targets import Target

BLOCK_PREFIXES = ("lora_unet_transformer_blocks_",)  # its files' blocks
# layers no other family has, under any prefix (diffusers' example's ``transformer.*`` files
# read as ``lora_transformer_transformer_blocks_``, as SD 3.5's do)
MARKERS = ("_img_mlp_net_", "_txt_mlp_net_", "_img_mod_1", "_txt_mod_1")
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = False  # no T5


def kohya_targets(transformer: torch.nn.Module) -> list[Target]:
    """Every Linear of the transformer under ``lora_unet_`` + its path."""
    return [Target(kohya_module_name("lora_unet", path), path, TRANSFORMER, module)
            for path, module in unwrap(transformer).named_modules()
            if isinstance(module, torch.nn.Linear)]


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The layers the family's LoRA trains (:func:`qwen_target_modules`)."""
    chosen = set(qwen_target_modules(transformer))
    return [t for t in kohya_targets(transformer) if t.path in chosen]


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """No text-encoder LoRA (none of the peers trains one for Qwen-Image)."""
    return []
