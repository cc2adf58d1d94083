"""FLUX.2's shared modulations kept in bf16 where their fp32 weights are bf16 values.

FLUX.2 computes every block's modulation from the timestep embedding with Linear layers that
all blocks share (``double_stream_modulation_img`` / ``_txt``, ``single_stream_modulation``)
and the output norm's (``norm_out.linear``): 160 M of klein 4B's parameters, 0.6 GiB in fp32,
which multiply one vector per sample. An fp32 run of a bf16 file (the released files are bf16)
holds them as bf16 values in fp32. :func:`keep_bf16` stores such a frozen weight in bf16 and
computes each call from an fp32 copy of it: the same values, so the same numbers bit for bit,
at half their memory, for one conversion per call (a step calls each once). Nothing depends
on the timestep's gradient, so no copy is kept for a backward.

Left as they are: a weight that is not exactly bf16 (an fp32 file), one already in another
dtype (bf16 or fp8 storage), a trained one, a layer with hooks or a replaced forward
(LyCORIS), and multi-process runs (DDP and FSDP own the parameters).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SHARED = ("double_stream_modulation_img.linear", "double_stream_modulation_txt.linear",
          "single_stream_modulation.linear", "norm_out.linear")


def keep_bf16(transformer: Any) -> int:
    """Store the shared layers' weights of ``transformer`` (a ``Flux2Transformer2DModel``, or
    a module holding one) in bf16 where that loses nothing; returns how many layers. Called on
    every denoiser call: it decides once every layer is frozen (a call before the run froze
    the base, such as the CPU's precision probe, decides nothing)."""
    if getattr(transformer, "_shared_weights_decided", False):
        return 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return 0
    model = transformer if hasattr(transformer, "single_stream_modulation") else next(
        (m for m in transformer.modules() if hasattr(m, "single_stream_modulation")), None)
    count, trained = 0, False
    for name in SHARED if model is not None else ():
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            continue
        weight = layer.weight if type(layer) is nn.Linear else None
        if weight is not None and weight.requires_grad:
            trained = True  # trained, or not frozen yet
            continue
        if weight is None or weight.dtype != torch.float32 \
                or weight.device.type == "meta" or type(weight) is not nn.Parameter \
                or layer._forward_pre_hooks or layer._forward_hooks or "forward" in vars(layer):
            continue
        half = weight.detach().to(torch.bfloat16)
        if not torch.equal(half.float(), weight.detach()):
            continue
        layer.weight = nn.Parameter(half, requires_grad=False)
        layer.forward = types.MethodType(_forward, layer)
        count += 1
    transformer._shared_weights_decided = not trained
    return count


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.weight.to(x.dtype), self.bias)
