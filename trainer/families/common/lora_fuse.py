"""A fused Linear's LoRA from the LoRAs of its parts (q, k and v trained apart, written as the
original layout's one ``qkv`` layer): what the BFL-layout and native-layout files of FLUX.2 and
Z-Image write."""

from __future__ import annotations

from typing import Any

import torch


def fuse(layers: list[Any], rows: list[int], adapter: str = "default"
         ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of a fused Linear from its parts' peft layers, in float32: the parts'
    ``lora_A`` stacked, their ``lora_B`` block-diagonal, ``alpha / R`` the parts' scale (a part
    of another scale has it folded into its block, with ``alpha = R``)."""
    scales = [float(layer.scaling[adapter]) for layer in layers]
    same = all(abs(s - scales[0]) <= 1e-6 * abs(scales[0]) for s in scales)
    downs = [layer.lora_A[adapter].weight.detach().float() for layer in layers]
    rank = sum(d.shape[0] for d in downs)
    up = torch.zeros(sum(rows), rank, dtype=torch.float32, device=downs[0].device)
    row = col = 0
    for layer, n, scale in zip(layers, rows, scales):
        b = layer.lora_B[adapter].weight.detach().float()
        up[row:row + n, col:col + b.shape[1]] = b * (1.0 if same else scale)
        row, col = row + n, col + b.shape[1]
    return torch.cat(downs, dim=0), up, (scales[0] if same else 1.0) * rank

