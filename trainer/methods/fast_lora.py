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

A Linear layer whose base is frozen runs as one autograd function, :class:`LoraLinear`: the
update is added into the base's output in place (``y += (x A^T) B^T * scale``, one matrix
product that accumulates) and its backward adds the update's input gradient into the base's
(``dx = dy W + (dy B * scale) A``), and takes the up projection's gradient as ``(h^T dy)^T``, whose
long side is contiguous. peft's forward instead writes the update and then the sum as two
more tensors of the output's size, and its backward another of the input's size, and reads
``dy`` across for the up projection's gradient: on FLUX.2 [klein]'s 3072 x 27648 fused layer at
768 tokens on a 2-core CPU that costs about 0.1 s of a 1.5 s forward and backward
(bench/lora_overhead.py ``--wide``). The numbers are peft's maths; only the order of a
sum's terms can round differently (tests hold them to peft's within float rounding).
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn


def _lora_update(layer: Any, x: torch.Tensor) -> torch.Tensor:
    a, b = layer._lean
    x = x if x.dtype == a.weight.dtype else x.to(a.weight.dtype)
    if isinstance(a, nn.Linear):
        return F.linear(F.linear(x, a.weight), b.weight)
    return b(a(x))


class LoraLinear(torch.autograd.Function):
    """``F.linear(x, w, bias) + F.linear(F.linear(x, a), b) * scale`` for a frozen ``w`` and
    ``bias``: one output tensor, the update accumulated into it, and a backward that
    accumulates likewise. Under autocast it computes in autocast's dtype, as the separate
    operations would; its gradients reach ``a`` and ``b`` in their own dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                a: torch.Tensor, b: torch.Tensor, scale: float,
                dtype: torch.dtype) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            xc, wc = x.to(dtype), w.to(dtype)
            ac, bc = a.to(dtype), b.to(dtype)
            # as rows: a slice of a sequence (x[:, n:]) would otherwise run as a batched
            # product over an expanded weight (on a 2-core CPU about a tenth slower per
            # product; no difference showed over a whole klein step)
            rows = xc.reshape(-1, xc.shape[-1])
            y = F.linear(rows, wc, None if bias is None else bias.to(dtype))
            h = F.linear(rows, ac)
            y.addmm_(h, bc.t(), alpha=scale)
            y = y.view(*xc.shape[:-1], y.shape[-1])
        ctx.save_for_backward(xc, h, w, a, b)
        ctx.scale, ctx.dtype = scale, dtype
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        xc, h, w, a, b = ctx.saved_tensors
        dtype, scale = ctx.dtype, ctx.scale
        with torch.autocast(dy.device.type, enabled=False):
            dy2 = dy.reshape(-1, dy.shape[-1]).to(dtype)
            ac, bc = a.to(dtype), b.to(dtype)
            dh = dy2 @ bc
            if scale != 1.0:
                dh = dh * scale
            dx = None
            if ctx.needs_input_grad[0]:
                dx = dy2 @ w.to(dtype)
                dx.addmm_(dh, ac)
                dx = dx.view(xc.shape)
            da = dh.t() @ xc.reshape(-1, xc.shape[-1]) if ctx.needs_input_grad[3] else None
            db = None
            if ctx.needs_input_grad[4]:
                db = (h.reshape(-1, h.shape[-1]).t() @ dy2).t()
                if scale != 1.0:
                    db = db * scale
        return dx, None, None, da, db, None, None


def _compute_dtype(x: torch.Tensor, *weights: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype :class:`LoraLinear` computes in: autocast's where it is on for ``x``'s
    device, else the one dtype that ``x`` and the weights share; None where they differ
    (peft's forward then casts as it does), and on the meta device."""
    kind = x.device.type
    if kind == "meta":  # the advisor's simulated step (trainer/advisor/footprint.py), whose
        return None     # shipped laws were measured on peft's operations
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype if all(t.dtype == x.dtype for t in weights) else None


def _lean_state(self: Any) -> bool:
    """The layer computes its one adapter, as :func:`lean_forward` set it up."""
    return not (self.disable_adapters or self.merged
                or self.active_adapters != self._lean_adapter)


def _one_function(self: Any, x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype :class:`LoraLinear` computes this layer in, for ``x``; None where it cannot
    (a hooked base, which fp8 storage computes from a copy in its hooks; a trained base; a
    Conv2d; mixed dtypes without autocast)."""
    base = self.base_layer
    if type(base) is not nn.Linear or base._forward_pre_hooks:
        return None
    a, b = self._lean
    frozen = not base.weight.requires_grad and (base.bias is None or not base.bias.requires_grad)
    return (frozen and isinstance(a, nn.Linear) and x.dim() >= 2
            and _compute_dtype(x, base.weight, a.weight, b.weight)) or None


def _forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if args or kwargs or not _lean_state(self):
        return self._peft_forward(x, *args, **kwargs)
    base = self.base_layer
    dtype = _one_function(self, x)
    if dtype:
        a, b = self._lean
        return LoraLinear.apply(x, base.weight, base.bias, a.weight, b.weight,
                                float(self._lean_scale), dtype)
    # a hooked base layer (fp8 storage computes from a copy in its hooks) is called as a module
    plain = type(base) is nn.Linear and not base._forward_pre_hooks
    result = F.linear(x, base.weight, base.bias) if plain else base(x)
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
        module._lean_columns = types.MethodType(_columns, module)
        count += 1
    return count


def _columns(self: Any, x: torch.Tensor, start: int, stop: int) -> Optional[torch.Tensor]:
    """``self(x)[..., start:stop]`` as :class:`LoraLinear` on those rows of the base weight and
    of the up projection (whose gradient then reaches those rows alone); None where the layer
    does not run as that function (the caller then computes it whole). Given to each lean layer
    as ``_lean_columns`` (trainer/families/common/columns.py asks for it)."""
    if self._forward_pre_hooks or self._forward_hooks \
            or getattr(self.forward, "__func__", None) is not _forward or not _lean_state(self):
        return None
    dtype = _one_function(self, x)
    if not dtype:
        return None
    base, (a, b) = self.base_layer, self._lean
    bias = None if base.bias is None else base.bias[start:stop]
    return LoraLinear.apply(x, base.weight[start:stop], bias, a.weight, b.weight[start:stop],
                            float(self._lean_scale), dtype)
