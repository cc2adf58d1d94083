"""FLUX.1's layers as the tools (inspect, merge, resize, extract) name them: sd-scripts' kohya
names on Black Forest Labs' layout (``lora_unet_double_blocks_0_img_attn_qkv``), a fused layer
being several diffusers layers in row order (the target's ``pieces``); CLIP-L ``lora_te1_`` and
T5 ``lora_te3_`` (the pipeline's ``text_encoder_2``). See :mod:`trainer.tools.flow_targets`."""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.export.names import kohya_module_name
from trainer.families.flux.lora import flux_part_modules
from trainer.tools.flow_targets import group
from trainer.tools.targets import Target, encoder_targets

BLOCK_PREFIXES = ("lora_unet_double_blocks_", "lora_unet_single_blocks_")  # its files' blocks
FILE_FORM = "kohya"  # the form of its LoRA files (trainer/tools/flow_extract.py)
TRAINS_T5 = True  # its LoRA may train T5 (trainer/families/flux/lora.py)
# diffusers' / SimpleTuner's form (``transformer.<diffusers path>``, read as lora_transformer_):
# the double blocks are named as SD 3.5's joint blocks, the single-stream blocks only FLUX has
DIFFUSERS_DOUBLE = "lora_transformer_transformer_blocks_"
DIFFUSERS_SINGLE = "lora_transformer_single_transformer_blocks_"
WIDTH = 3072  # FLUX.1's hidden size, 24 heads of 128; SD 3.5's are 64 x heads: 1536, 2432
# FLUX.1's single-block layers (FLUX.2's are fused: attn.to_qkv_mlp_proj, attn.to_out)
SINGLE_LAYERS = ("_attn_to_q", "_attn_to_k", "_attn_to_v", "_proj_mlp", "_proj_out",
                 "_norm_linear")


def tells(modules: dict[str, Any]) -> Optional[str]:
    """Why a file in the diffusers form is FLUX.1's, or None: it has single-stream blocks
    (FLUX.2's fused ones are told first, by FLUX.2's own layer names), or its double blocks
    take FLUX.1's width. Chroma's diffusers names are FLUX.1's: only metadata tells those."""
    if any(n.startswith(DIFFUSERS_SINGLE) and n.endswith(SINGLE_LAYERS) for n in modules):
        return "diffusers block names with single-stream blocks (SD 3.5 has none)"
    for name, module in modules.items():
        down = module.tensors.get("lora_down.weight")
        if name.startswith(DIFFUSERS_DOUBLE) and name.endswith("_attn_to_q") \
                and down is not None and down.shape[1] == WIDTH:
            return f"diffusers double blocks of width {WIDTH} (SD 3.5's are 1536 or 2432)"
    return None


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
