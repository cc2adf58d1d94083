"""sd-scripts' regularizers of a LoRA network on peft's layers: max-norm (``scale_weight_norms``)
and rank / module dropout (``network_args`` ``rank_dropout`` / ``module_dropout``).

Max-norm (sd-scripts' ``LoRANetwork.apply_max_norm_regularization``, after every optimizer
step): each module's update ``W = up @ down * alpha / rank`` (a 3x3 down convolved with the 1x1
up for LoCon) has its Frobenius norm clamped to at least ``max / 2``; when it is above ``max``,
up and down are both multiplied by ``sqrt(max / norm)``. It returns how many modules were
scaled and the mean and largest norm after, which sd-scripts logs as ``max_norm/keys_scaled``,
``max_norm/average_key_norm`` and ``max_norm/max_key_norm``.

Rank and module dropout (sd-scripts' ``LoRAModule.forward``, in training only): module dropout
skips a module's LoRA for the whole step with probability p; rank dropout zeroes each rank of
the down projection's output per sample with probability p and scales the update by
``1 / (1 - p)``. peft's ``lora_dropout`` drops the input features instead: not the same thing.
"""

from __future__ import annotations

import types
from typing import Any, Optional

import torch


def _update(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    if a.dim() == 4 and a.shape[2:] != (1, 1):  # 3x3 down, 1x1 up
        return torch.nn.functional.conv2d(a.permute(1, 0, 2, 3), b).permute(1, 0, 2, 3) * scale
    return (b.flatten(1) @ a.flatten(1)) * scale


@torch.no_grad()
def apply_max_norm(roots: list[torch.nn.Module], max_norm: float) -> tuple[int, float, float]:
    """Scale down every peft LoRA module of ``roots`` whose update's norm exceeds
    ``max_norm``; returns (modules scaled, mean norm, max norm) after scaling."""
    from trainer.export.lora import iter_lora_layers

    scaled, norms = 0, []
    for root in roots:
        for _, layer in iter_lora_layers(root):
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            updown = _update(a.float(), b.float(), float(layer.scaling["default"]))
            norm = updown.norm().clamp(min=max_norm / 2)
            ratio = (torch.clamp(norm, max=max_norm) / norm).item()
            if ratio != 1:
                scaled += 1
                a.mul_(ratio ** 0.5)
                b.mul_(ratio ** 0.5)
            norms.append(updown.norm().item() * ratio)
    return scaled, (sum(norms) / len(norms) if norms else 0.0), max(norms, default=0.0)


def _dropout_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    p_module, p_rank = self._sd_dropout
    if self.training and p_module and torch.rand(1).item() < p_module:
        return self.base_layer(x, *args, **kwargs)
    result = self._before_dropout(x, *args, **kwargs)
    if not self.training or not p_rank:
        return result
    # the update again, with a rank mask: result - update + masked update / (1 - p)
    a, b = self.lora_A["default"], self.lora_B["default"]
    scale = self.scaling["default"]
    lx = a(x.to(a.weight.dtype))
    mask = (torch.rand((lx.shape[0], lx.shape[-1] if lx.dim() != 4 else lx.shape[1]),
                       device=lx.device) > p_rank).to(lx.dtype)
    mask = mask.view(lx.shape[0], 1, -1) if lx.dim() == 3 else (
        mask[:, :, None, None] if lx.dim() == 4 else mask)
    full = b(lx) * scale
    kept = b(lx * mask) * (scale / (1 - p_rank))
    return (result - full + kept).to(result.dtype)


def add_dropout(roots: list[torch.nn.Module], rank: Optional[float],
                module: Optional[float]) -> int:
    """Give every peft LoRA layer of ``roots`` sd-scripts' rank and module dropout; returns how
    many. Layers keep their weights and names."""
    from trainer.export.lora import iter_lora_layers

    if not rank and not module:
        return 0
    count = 0
    for root in roots:
        for _, layer in iter_lora_layers(root):
            layer._sd_dropout = (module or 0.0, rank or 0.0)
            layer._before_dropout = layer.forward
            layer.forward = types.MethodType(_dropout_forward, layer)
            count += 1
    return count
