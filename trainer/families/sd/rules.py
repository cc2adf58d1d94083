"""SD 1.x / 2.x facts the config's rules read (torch-free; the config layer): the UNet's blocks
as sd-scripts' ``networks/lora.py`` counts them for block-wise LoRA
(trainer/config/lora_blocks.py)."""

from __future__ import annotations

import re

# (down/up lr weights, mid lr weights, blocks): 0 is conv_in (no LoRA), 1-11 down, 12 mid,
# 13-24 up
LORA_BLOCKS = (12, 1, 25)
_UPDOWN = re.compile(r"(up|down)_blocks_(\d+)_(resnets|upsamplers|downsamplers|attentions)_"
                     r"(\d+)_")


def lora_block_index(kohya_name: str) -> int:
    """sd-scripts' block of a UNet module from its kohya name (``lora_unet_...``), -1: none:
    ``down_blocks_i_{resnets,attentions}_j`` is ``1 + 3i + j`` (downsamplers ``1 + 3i + 2``),
    ``mid_block`` 12, ``up_blocks_i_..._j`` ``13 + 3i + j`` (upsamplers ``13 + 3i + 2``)."""
    match = _UPDOWN.search(kohya_name)
    if match:
        side, i, kind, j = match.groups()
        idx = 3 * int(i) + (2 if kind in ("upsamplers", "downsamplers") else int(j))
        return 1 + idx if side == "down" else 13 + idx
    return 12 if "mid_block_" in kohya_name else -1
