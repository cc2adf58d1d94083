"""A lean forward for peft's LoRA layers on the training hot path.

peft's ``LoraLayer.forward`` serves every use: several adapters, mixed batches, merging,
variants (DoRA), dropout, input casts. Training one plain adapter needs none of that, and on
small inputs its Python (four module calls and dictionary look-ups per layer) costs about a
fifth of a step (tiny model, CPU, measured with bench/lora_overhead.py). :func:`lean_forward`
gives each plain LoRA layer a forward that computes the same operations, in the same order, as
peft's (``base(x) + B(A(x)) * scale``, without the product when the scale is 1, so results
are bit-identical), and falls back to peft's own forward whenever the layer is in any other
state (adapters disabled or merged, extra arguments). A base layer with forward hooks (fp8
storage, trainer/models/memory.py) is called as a module, so that its hooks run. The modules,
parameter names and saved files are peft's, unchanged.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _lora_update(layer: Any, x: torch.Tensor) -> torch.Tensor:
    a, b = layer._lean
    x = x if x.dtype == a.weight.dtype else x.to(a.weight.dtype)
    if isinstance(a, nn.Linear):
        return F.linear(F.linear(x, a.weight), b.weight)
    return b(a(x))


def _forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if args or kwargs or self.disable_adapters or self.merged \
            or self.active_adapters != self._lean_adapter:
        return self._peft_forward(x, *args, **kwargs)
    base = self.base_layer
    # a hooked base layer (fp8 storage computes from a copy in its hooks) is called as a module
    if type(base) is nn.Linear and not base._forward_pre_hooks:
        result = F.linear(x, base.weight, base.bias)
    else:
        result = base(x)
    update = _lora_update(self, x)
    # x * 1.0 is x, bit for bit, and so is its gradient: alpha == rank skips an op each way
    out = result + (update if self._lean_scale == 1.0 else update * self._lean_scale)
    return out if out.dtype == result.dtype else out.to(result.dtype)


def _plain(layer: Any, name: str) -> bool:
    """One vanilla adapter, no dropout, no bias, no variant, Linear or Conv2d."""
    if name not in layer.lora_A or name not in layer.lora_B:
        return False
    a, b = layer.lora_A[name], layer.lora_B[name]
    return (not layer.lora_variant.get(name)
            and isinstance(layer.lora_dropout[name], nn.Identity)
            and type(a) in (nn.Linear, nn.Conv2d) and type(b) is type(a)
            and a.bias is None and b.bias is None
            and type(layer.base_layer) in (nn.Linear, nn.Conv2d)
            and not getattr(layer, "fan_in_fan_out", False))


def lean_forward(model: nn.Module, adapter_name: str = "default") -> int:
    """Give every plain LoRA layer of ``model`` the lean forward; returns how many."""
    from peft.tuners.lora import LoraLayer

    count = 0
    for module in model.modules():
        if not isinstance(module, LoraLayer) or not _plain(module, adapter_name):
            continue
        module._lean = (module.lora_A[adapter_name], module.lora_B[adapter_name])
        module._lean_scale = module.scaling[adapter_name]
        module._lean_adapter = [adapter_name]
        module._peft_forward = module.forward
        module.forward = types.MethodType(_forward, module)
        count += 1
    return count
