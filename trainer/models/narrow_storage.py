"""Frozen fp32 weights that hold bf16 (or fp16) values, stored in that narrower dtype.

Released checkpoints are stored in bf16 (FLUX.1, FLUX.2, Z-Image, Qwen-Image) or fp16 (SD 1.x
pruned files). A run that computes in fp32 (the CPU without bf16 units, ``mixed_precision =
"no"``) loads them widened to fp32, which adds nothing: every bf16 value is an fp32 value, so the
upper half of each weight is zeros and the model takes twice the memory it needs. Here each
frozen ``nn.Linear`` of the denoiser whose weight holds only values of a narrower dtype (checked
value by value, so a weight that lost them, by training or a merge, stays in fp32) keeps that
dtype, and its forward computes ``F.linear`` in fp32 from a copy made for the call
(:class:`NarrowLinear`). The copy is exactly the fp32 weight the layer had: the step computes the
same numbers, in the same kernels.

Autograd does not keep the copy: :class:`NarrowLinear` saves the stored weight and widens it again
for the backward pass (the input's gradient; a frozen weight needs none), so a step holds half the
weights' bytes, not both widths (``ComputeCopies`` of trainer/models/memory.py, for fp8, keeps the
copies: there gradient checkpointing is the answer). The cost is two casts per layer and step:
memory traffic, small against the matmul that follows (bench/flux2_klein_lora_vs_diffusers.py).

The layers chosen are those fp8 storage holds (trainer/models/memory.py's ``fp8_layers``: the
embedders, the first and last projections and the model's own fp32 list keep fp32), Linear only,
and not one whose forward something replaced already (LyCORIS wraps a layer so: it keeps fp32).
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch
import torch.nn.functional as F

NARROW = (torch.bfloat16, torch.float16)  # tried in this order


class NarrowLinear(torch.autograd.Function):
    """``F.linear(x, weight.to(dtype), bias)`` that saves the stored ``weight``, not the copy."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.dtype = dtype
        return F.linear(x, weight.to(dtype), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (weight,) = ctx.saved_tensors
        grad_x = grad.matmul(weight.to(ctx.dtype)) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return NarrowLinear.apply(x, self.weight, self.bias, self.compute_dtype)


def narrowest(weight: torch.Tensor) -> Optional[torch.dtype]:
    """The first of :data:`NARROW` that holds every value of the fp32 ``weight``, if one does."""
    if weight.dtype != torch.float32:
        return None
    for dtype in NARROW:
        narrow = weight.to(dtype)
        if torch.equal(narrow.to(torch.float32), weight):
            return dtype
    return None


def store_narrow(module: torch.nn.Module) -> tuple[int, int]:
    """The frozen fp32 Linear layers of ``module`` (those of ``fp8_layers``) whose weights hold
    a narrower dtype's values, stored in it (see the module's notes). Returns how many layers
    and the bytes freed."""
    from trainer.models.memory import _fp32_listed, fp8_layers

    count = freed = 0
    for name, layer in fp8_layers(module):
        if type(layer) is not torch.nn.Linear or _fp32_listed(module, name):
            continue
        if any(p.requires_grad for p in layer.parameters()) or "forward" in vars(layer):
            continue  # trained, or its forward replaced already (LyCORIS wraps it so)
        dtype = narrowest(layer.weight.data)
        if dtype is None:
            continue
        before = layer.weight.numel() * layer.weight.element_size()
        layer.weight = torch.nn.Parameter(layer.weight.data.to(dtype), requires_grad=False)
        layer.compute_dtype = torch.float32  # peft makes adapters in it (bitsandbytes' way)
        layer.forward = types.MethodType(_forward, layer)
        freed += before - layer.weight.numel() * layer.weight.element_size()
        count += 1
    return count, freed
