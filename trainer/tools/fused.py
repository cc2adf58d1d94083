"""Fused modules of the flow families' LoRA files: one LoRA over layers that diffusers splits.

FLUX.1's kohya files (Black Forest Labs' layout, :mod:`trainer.families.flux.lora`) and
sd-scripts' SD3 files (and Z-Image's native ones) name the original model's fused Linear
layers: ``img_attn.qkv`` / ``txt_attn.qkv`` / SD3's ``attn.qkv`` / Z-Image's ``attention.qkv``
(rows: q, k, v, equal) and FLUX.1's ``linear1`` (rows: q,
k, v of the block's width, which is the layer's input width, then the MLP's input). A LoRA
trained on diffusers' split layers (ours; sd-scripts' ``split_qkv``) is written fused with a
block-diagonal ``lora_up``: part i's rows use only part i's rank columns. :func:`block_parts`
finds those blocks, so that resize and extract keep one rank per part and write the form that
diffusers' converter splits back exactly (its "sparse" case in ``_convert_to_ai_toolkit_cat``),
and :func:`fuse` writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

QKV = re.compile(r"^lora_unet_(double_blocks_\d+_(img|txt)_attn|"
                 r"joint_blocks_\d+_(x_block_attn2?|context_block_attn)|"
                 r"(layers|noise_refiner|context_refiner)_\d+_attention)_qkv$")  # + native DiT
LINEAR1 = re.compile(r"^lora_unet_single_blocks_\d+_linear1$")


def part_rows(name: str, out: int, inp: int) -> Optional[list[int]]:
    """The row counts of the parts of the fused layer ``name`` ([out, inp]), or None when the
    name is no fused layer (or its shape cannot be one)."""
    if QKV.match(name) and out % 3 == 0:
        return [out // 3] * 3
    if LINEAR1.match(name) and out > 3 * inp:
        return [inp, inp, inp, out - 3 * inp]
    return None


@dataclass(frozen=True)
class Block:
    rows: slice  # the part's rows of the fused layer
    cols: torch.Tensor  # the rank columns of ``lora_up`` that feed it (indices)


def block_parts(up: torch.Tensor, rows: list[int]) -> Optional[list[Block]]:
    """The parts' blocks of a block-diagonal ``lora_up`` [out, R]; None when a rank column
    feeds two parts or none is used (a dense fused LoRA, as sd-scripts trains by default)."""
    up = up.flatten(1)
    used = torch.zeros(up.shape[1], dtype=torch.bool)
    blocks, start = [], 0
    for count in rows:
        cols = (up[start:start + count] != 0).any(dim=0)
        if (cols & used).any():
            return None
        used |= cols
        blocks.append(Block(slice(start, start + count), cols.nonzero().flatten()))
        start += count
    return blocks if used.any() and start == up.shape[0] else None


def fuse(parts: list[tuple[torch.Tensor, torch.Tensor]], rows: list[int]
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lora_up [out, K], lora_down [K, in]) of one fused layer from each part's (up [rows_i,
    k_i], down [k_i, in]) in row order: ``down`` stacked, ``up`` block-diagonal (a part with
    k_i = 0 has zero rows)."""
    rank = sum(up.shape[1] for up, _ in parts)
    width = parts[0][1].shape[1]
    up = torch.zeros(sum(rows), rank, dtype=parts[0][0].dtype)
    row = col = 0
    for (part_up, _), count in zip(parts, rows):
        up[row:row + count, col:col + part_up.shape[1]] = part_up
        row, col = row + count, col + part_up.shape[1]
    down = torch.cat([d.reshape(-1, width) for _, d in parts], dim=0)
    return up, down
