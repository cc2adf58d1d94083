"""SD 3 / 3.5's layers as the tools (inspect, merge, resize, extract) name them: the
``transformer.*`` form (read as ``lora_transformer_<diffusers path>``), CLIP-L ``text_encoder.``
/ ``lora_te1_``, CLIP-G ``text_encoder_2.`` / ``lora_te2_``, T5 ``lora_te3_``; and sd-scripts'
own SD3 names (``lora_unet_joint_blocks_0_x_block_attn_qkv``), fused like FLUX.1's, with the
last block's pre-only context modulation's halves swapped (diffusers stores it as (scale,
shift), Stability as (shift, scale)). See :mod:`trainer.tools.flow_targets`."""

from __future__ import annotations

from typing import Any

import torch

from trainer.export.names import unwrap
from trainer.families.sd3.lora import SD3_PARTS, sd3_target_modules
from trainer.tools.flow_targets import group, transformer_layers
from trainer.tools.targets import Target, encoder_targets

LABEL = "SD 3 / 3.5"  # its LoRA files serve SD 3 and SD 3.5 alike
BLOCK_PREFIXES = ("lora_transformer_transformer_blocks_", "lora_unet_joint_blocks_")
FILE_FORM = "peft"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = False  # its files hold no T5 (trainer/families/sd3/lora.py)


def _as_is(path: str) -> str:
    return path


def kohya_targets(transformer: torch.nn.Module) -> list[Target]:
    """sd-scripts' SD3 names over diffusers' layers (fused qkv; swapped last modulation)."""
    root = unwrap(transformer)
    existing = {n for n, _ in root.named_modules()}
    layers = root.config.num_layers
    out = []
    for n in range(layers):
        for part, modules in SD3_PARTS.items():
            paths = tuple(f"transformer_blocks.{n}.{m}" for m in modules)
            if not all(p in existing for p in paths):
                continue
            swap = part == "context_block_adaLN_modulation_1" and n == layers - 1
            out.append(group(transformer, f"lora_unet_joint_blocks_{n}_{part}", paths, swap))
    return out


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The transformer layers the family's LoRA trains: the joint blocks' (their
    ``transformer.*`` keys)."""
    chosen = set(sd3_target_modules(transformer))
    return [t for t, _ in transformer_layers(transformer) if t.path in chosen]


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """CLIP-L (``lora_te1_``, also ``lora_te_``), CLIP-G (``lora_te2_``) and T5
    (``lora_te3_``) where the model has it."""
    found = encoder_targets(model.text_encoder, "lora_te1", "te1", aliases=["lora_te"])
    found += encoder_targets(model.text_encoder_2, "lora_te2", "te2")
    if getattr(model, "text_encoder_3", None) is not None:
        found += encoder_targets(model.text_encoder_3, "lora_te3", "te3", rename=_as_is)
    return found
