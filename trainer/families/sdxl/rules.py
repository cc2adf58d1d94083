"""SDXL facts the config's rules read (torch-free; the config layer): the UNet's blocks as
sd-scripts' ``networks/lora.py`` counts them on the SGM names for block-wise LoRA
(trainer/config/lora_blocks.py)."""

from __future__ import annotations

# (down/up lr weights, mid lr weights, blocks): 0 time_embed / label_emb, 1-9 input_blocks,
# 10-12 middle_block, 13-21 output_blocks, 22 out; the first and last take weight 1.0
LORA_BLOCKS = (9, 3, 23)


def lora_block_index(kohya_name: str) -> int:
    """sd-scripts' block of a UNet module from its kohya name (``lora_unet_...``), -1: none:
    ``input_blocks_n`` is ``1 + n``, ``middle_block_n`` ``10 + n``, ``output_blocks_n``
    ``13 + n``."""
    name = kohya_name.removeprefix("lora_unet_")
    for start, first in (("input_blocks_", 1), ("middle_block_", 10), ("output_blocks_", 13)):
        if name.startswith(start):
            return first + int(name.split("_")[2])
    return 0 if name.startswith(("time_embed_", "label_emb_")) else (
        22 if name.startswith("out_") else -1)
