"""Some output columns of a linear layer, computing only those where that is safe.

FLUX.2's last single-stream block needs, for the text rows, only the key and value columns of
its fused input projection (trainer/families/flux2/last_block.py). :func:`linear_columns`
multiplies by those rows of the weight for a frozen ``nn.Linear`` and for a layer that offers
``_lean_columns`` (the lean LoRA layers of trainer/methods/fast_lora.py); every other layer (a
trained weight, fp8 storage's hooks, LyCORIS, which replaces the layer's forward,
bitsandbytes) is computed whole and sliced, so the result is the same with every wrapper; only
the sliced product's rounding can differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def linear_columns(layer: nn.Module, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``layer(x)[..., start:stop]``."""
    hooked = layer._forward_pre_hooks or layer._forward_hooks
    # LyCORIS puts its adapter in the layer's forward, an attribute of the instance
    if type(layer) is nn.Linear and not hooked and "forward" not in vars(layer) \
            and not layer.weight.requires_grad \
            and (layer.bias is None or not layer.bias.requires_grad):
        bias = None if layer.bias is None else layer.bias[start:stop]
        rows = F.linear(x.reshape(-1, x.shape[-1]), layer.weight[start:stop], bias)
        return rows.view(*x.shape[:-1], rows.shape[-1])
    lean = getattr(layer, "_lean_columns", None)
    out = lean(x, start, stop) if lean is not None else None
    return out if out is not None else layer(x)[..., start:stop]
