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

from trainer.export.names import kohya_module_name, unwrap
from trainer.families.zimage.lora import BLOCKS, UNET_PREFIX, part_modules
from trainer.tools.flow_targets import group
from trainer.tools.targets import Target

LABEL = "Z-Image"
# its files' blocks: kohya names (ours, musubi-tuner's, ai-toolkit's diffusion_model.<path>) and
# diffusers' example's transformer.<path> (read as lora_transformer_<path>)
BLOCK_PREFIXES = tuple(f"{p}_{b}_" for p in (UNET_PREFIX, "lora_transformer") for b in BLOCKS)
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = False


def _other_layers(transformer: torch.nn.Module, covered: set[str]) -> list[Target]:
    """The blocks' other Linear layers (the modulations, which ai-toolkit trains), under
    ``lora_unet_`` + their path: the same in both layouts."""
    return [group(transformer, kohya_module_name(UNET_PREFIX, path), (path,))
            for path, module in unwrap(transformer).named_modules()
            if isinstance(module, torch.nn.Linear) and path.split(".", 1)[0] in BLOCKS
            and path not in covered]


def kohya_targets(transformer: torch.nn.Module, blocks: tuple[str, ...] = BLOCKS
                  ) -> list[Target]:
    """The native names (fused qkv) and musubi-tuner's names of each split layer, and the
    blocks' other layers."""
    out, covered = [], set()
    for native, paths in part_modules(transformer, blocks).items():
        out.append(group(transformer, kohya_module_name(UNET_PREFIX, native), paths))
        if len(paths) > 1 or not paths[0].endswith(native.split(".", 2)[2]):
            out += [group(transformer, kohya_module_name(UNET_PREFIX, p), (p,)) for p in paths]
        covered.update(paths)
    return out + _other_layers(transformer, covered)


def trained_targets(transformer: torch.nn.Module) -> list[Target]:
    """The layers extract takes, under the names the family's files give them: every Linear of
    the blocks, the refiners' too (``network.train_blocks``), and their modulations (which
    ai-toolkit trains); a layer a fine-tune did not change is left out of the file."""
    parts = part_modules(transformer, BLOCKS)
    out = [group(transformer, kohya_module_name(UNET_PREFIX, native), paths)
           for native, paths in parts.items()]
    return out + _other_layers(transformer, {p for paths in parts.values() for p in paths})


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    return []
