"""DyLoRA on peft's LoRA layers (``network.dylora_unit``), as sd-scripts' ``networks/dylora.py``
trains it.

DyLoRA (Valipour et al. 2022, "DyLoRA: Parameter-Efficient Tuning of Pre-trained Models using
Dynamic Search-Free Low-Rank Adaptation") trains a LoRA so that its first ranks work on their
own: the file can be cut to a smaller rank afterwards. sd-scripts' ``DyLoRAModule`` does it
this way, and so does this module:

- each module holds its down (A) and up (B) matrices as one parameter per rank (sd-scripts'
  ``ParameterList``s), so a rank that does not train in a step gets no gradient at all and the
  optimizer leaves it alone (no momentum, no weight decay), as in sd-scripts;
- in every training forward, each module draws ``r`` uniformly from ``0 .. dim-1`` and rounds
  it down to a multiple of ``unit``: ``b = r - r % unit``. Only ranks ``b .. b+unit-1`` get
  gradients (the others enter the forward detached);
- the forward uses all ``dim`` ranks (sd-scripts concatenates every rank; the paper's
  truncation to the first ``b+unit`` is not what it does) and scales the update by
  ``alpha / dim * sqrt(dim / (b + unit))``;
- outside training (samples, validation, the saved file) the layer is a plain LoRA at the full
  rank, ``alpha / dim``: the file is a kohya LoRA that diffusers, ComfyUI and AUTOMATIC1111 load.
  (sd-scripts draws a rank in evaluation too; the studio's samples show the file instead.)

The draw uses torch's generator, so gradient checkpointing's re-run of a forward (which restores
torch's random state) draws the same block, and a resumed run draws what an unbroken one would.
The convolutions of ``conv_dim`` (which must equal ``network_dim``) train at ``network_alpha``,
as in sd-scripts (trainer/config/rules/dylora.py refuses what DyLoRA cannot do).
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.methods.lora import LoraMethod

ADAPTER = "default"


class RankSplit(nn.Module):
    """One LoRA factor as one parameter per rank; ``weight`` is the whole matrix (peft's shape:
    A ``[r, in(, k, k)]`` split along dim 0, B ``[out, r(, 1, 1)]`` along dim 1), so peft's
    forward, merging and the exporters read it unchanged."""

    def __init__(self, layer: nn.Module, axis: int):
        super().__init__()
        self.axis = axis
        self.ranks = nn.ParameterList(
            [nn.Parameter(w.detach().clone()) for w in layer.weight.split(1, dim=axis)])
        conv = isinstance(layer, nn.Conv2d)
        self.conv = (layer.stride, layer.padding, layer.dilation) if conv else None

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat(list(self.ranks), dim=self.axis)

    def block(self, start: int, unit: int) -> torch.Tensor:
        """The matrix with gradients only to ranks ``start .. start+unit-1``."""
        return torch.cat([p if start <= i < start + unit else p.detach()
                          for i, p in enumerate(self.ranks)], dim=self.axis)

    def apply(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.conv is None:
            return F.linear(x, weight)
        return F.conv2d(x, weight, None, *self.conv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, self.weight)


def draw_block(dim: int, unit: int) -> int:
    """sd-scripts' trainable rank: uniform in ``0 .. dim-1``, rounded down to a multiple of
    ``unit``."""
    r = int(torch.randint(0, dim, (1,)))
    return r - r % unit


def block_scale(scale: float, dim: int, start: int, unit: int) -> float:
    """sd-scripts' scaling of the update when ranks ``start .. start+unit-1`` train."""
    return scale * math.sqrt(dim / (start + unit))


def _forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if not self.training or args or kwargs or self.disable_adapters or self.merged \
            or self.active_adapters != [ADAPTER]:
        return self._dylora_plain(x, *args, **kwargs)  # peft's forward: the full rank
    a, b = self.lora_A[ADAPTER], self.lora_B[ADAPTER]
    dim, unit = len(a.ranks), self._dylora_unit
    start = draw_block(dim, unit)
    result = self.base_layer(x)
    wa, wb = a.block(start, unit), b.block(start, unit)
    update = b.apply(a.apply(x.to(wa.dtype), wa), wb)
    out = result + update * block_scale(self.scaling[ADAPTER], dim, start, unit)
    return out if out.dtype == result.dtype else out.to(result.dtype)


def split_layer(layer: Any, unit: int, alpha: float) -> dict[int, list[nn.Parameter]]:
    """Turn one peft LoRA layer into a DyLoRA layer at ``alpha / dim``; returns
    {id(old parameter): its per-rank parameters}."""
    old_a, old_b = layer.lora_A[ADAPTER], layer.lora_B[ADAPTER]
    new_a, new_b = RankSplit(old_a, 0), RankSplit(old_b, 1)
    layer.lora_A[ADAPTER], layer.lora_B[ADAPTER] = new_a, new_b
    layer.lora_alpha[ADAPTER] = alpha
    layer.scaling[ADAPTER] = alpha / layer.r[ADAPTER]
    layer._dylora_unit = unit
    layer._dylora_plain = types.MethodType(type(layer).forward, layer)
    layer.forward = types.MethodType(_forward, layer)
    return {id(old_a.weight): list(new_a.ranks), id(old_b.weight): list(new_b.ranks)}


def apply_dylora(roots: list[nn.Module], unit: int, alpha: float
                 ) -> dict[int, list[nn.Parameter]]:
    """Make every peft LoRA layer of ``roots`` a DyLoRA layer; the parameter map of all."""
    from trainer.export.lora import iter_lora_layers

    mapping: dict[int, list[nn.Parameter]] = {}
    for root in roots:
        for name, layer in list(iter_lora_layers(root)):
            if layer.r[ADAPTER] % unit:
                raise ValueError(f"{name}: rank {layer.r[ADAPTER]} is not a multiple of "
                                 f"network.dylora_unit = {unit}")
            mapping.update(split_layer(layer, unit, alpha))
    return mapping


def remap_groups(groups: list[dict[str, Any]], mapping: dict[int, list[nn.Parameter]]
                 ) -> list[dict[str, Any]]:
    """The optimizer groups with each replaced matrix replaced by its per-rank parameters
    (LoRA+ and the learning rates stay per group)."""
    out = []
    for group in groups:
        params = [q for p in group["params"] for q in mapping.get(id(p), [p])]
        out.append({**group, "params": params})
    return out


class DyLoraMethod(LoraMethod):
    """LoRA trained the DyLoRA way; saved as the plain LoRA file (LoraMethod.save)."""

    def prepare(self, model: Any) -> list[dict[str, Any]]:
        groups = super().prepare(model)
        net = self.cfg.network
        mapping = apply_dylora(self.trained_roots, net.dylora_unit, net.network_alpha)
        return remap_groups(groups, mapping)
