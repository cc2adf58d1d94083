"""A fused Linear's LoRA from the LoRAs of its parts (q, k and v trained apart, written as the
original layout's one ``qkv`` layer): what the BFL-layout and native-layout files of FLUX.2,
Chroma and Z-Image write, and what :mod:`trainer.families.common.lora_forms` makes of the peers'
split files."""

from __future__ import annotations

from typing import Any, Optional

import torch

Factors = tuple[torch.Tensor, torch.Tensor, float]  # (lora_down, lora_up, scale alpha / rank)


def fuse_factors(parts: list[tuple[Optional[Factors], int]]
                 ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of a fused Linear from its parts' factors (None for a part without a
    LoRA: zero rows) with their output rows, in row order, in float32: the parts' ``down``
    stacked, their ``up`` block-diagonal, ``alpha / R`` the parts' scale (a part of another
    scale has it folded into its block, with ``alpha = R``)."""
    trained = [f for f, _ in parts if f is not None]
    if not trained:
        raise ValueError("a fused layer needs a LoRA on one of its parts at least")
    scales = [float(s) for _, _, s in trained]
    same = all(abs(s - scales[0]) <= 1e-6 * abs(scales[0]) for s in scales)
    downs = [d.detach().float() for d, _, _ in trained]
    rank = sum(d.shape[0] for d in downs)
    up = torch.zeros(sum(rows for _, rows in parts), rank, dtype=torch.float32,
                     device=downs[0].device)
    row = col = 0
    for factors, rows in parts:
        if factors is not None:
            _, b, scale = factors
            up[row:row + rows, col:col + b.shape[1]] = b.detach().float() * (
                1.0 if same else float(scale))
            col += b.shape[1]
        row += rows
    return torch.cat(downs, dim=0), up, (scales[0] if same else 1.0) * rank


def layer_factors(layer: Optional[Any], adapter: str = "default") -> Optional[Factors]:
    """A peft LoRA layer's (lora_A, lora_B, scaling); None for no layer."""
    if layer is None:
        return None
    return (layer.lora_A[adapter].weight, layer.lora_B[adapter].weight,
            float(layer.scaling[adapter]))


def fuse(layers: list[Any], rows: list[int], adapter: str = "default"
         ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of a fused Linear from its parts' peft layers (:func:`fuse_factors`)."""
    return fuse_factors([(layer_factors(layer, adapter), n) for layer, n in zip(layers, rows)])
