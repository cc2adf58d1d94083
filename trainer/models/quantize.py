"""bitsandbytes' NF4 / int8 base weights (``model.base_precision = "nf4"`` / ``"int8"``): which
Linear layers of a denoiser are quantized, how one is, and the loader's storage that quantizes
each weight as it arrives.

Two ways to the same bytes:

- after a full-width build (:func:`quantize_linears`; a diffusers folder): each frozen
  ``nn.Linear`` is replaced by bitsandbytes' layer, quantized from its weight;
- as a single file streams (:func:`quantized_storage`, with trainer/models/streamed_load.py):
  the Linear layers of the meta-built model are replaced by bitsandbytes' layers before any
  weight is read, and each weight is read in the file's dtype, cast to the compute dtype and
  quantized on the CPU, one at a time, so the load holds the quantized model plus one group of
  tensors, never the model at full width (FLUX.1-dev: about 6.7 GB in NF4, 23.8 GB in bf16).

Both pick the same layers (the caller's skip patterns), cast the same way and make the same
bitsandbytes call. A Params4bit quantized on the CPU moves to the device with its quant_state
(bitsandbytes' ``Params4bit.to``); an Int8Params keeps its statistics (``CB``, ``SCB``) as
attributes that ``Module.to`` does not move: :func:`place_state` moves them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

CPU = torch.device("cpu")


def load_bitsandbytes() -> Any:
    """bitsandbytes, imported now (the trainer defers it: trainer/system/lazy_imports.py), and
    peft told so: it remembers whether bitsandbytes was there when first asked."""
    from trainer.system.lazy_imports import import_bitsandbytes

    bnb = import_bitsandbytes()
    try:
        from peft import import_utils
    except ImportError:
        return bnb
    for name in ("is_bnb_available", "is_bnb_4bit_available"):
        cache_clear = getattr(getattr(import_utils, name, None), "cache_clear", None)
        if cache_clear:
            cache_clear()
    return bnb


def skipped(name: str, patterns: tuple[str, ...]) -> bool:
    return any(re.search(p, name) for p in patterns)


def targets(module: torch.nn.Module, skip: tuple[str, ...]
            ) -> list[tuple[str, torch.nn.Linear]]:
    """The plain ``nn.Linear`` layers of ``module`` that are quantized (not in ``skip``)."""
    return [(n, m) for n, m in module.named_modules()
            if type(m) is torch.nn.Linear and not skipped(n, skip)]


def quantized_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The bitsandbytes Linear layers of ``module`` (none when bitsandbytes is not loaded, or
    deferred: trainer/system/lazy_imports.py marks it None)."""
    import sys

    bnb = sys.modules.get("bitsandbytes")  # None while it is deferred (lazy_imports)
    if bnb is None:
        return []
    kinds = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    return [m for m in module.modules() if isinstance(m, kinds)]


def bnb_layer(linear: torch.nn.Linear, kind: str, compute_dtype: torch.dtype
              ) -> torch.nn.Module:
    """An empty (meta) bitsandbytes layer of ``linear``'s shape."""
    bnb = load_bitsandbytes()
    bias = linear.bias is not None
    if kind == "nf4":
        return bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=bias,
                                 compute_dtype=compute_dtype, quant_type="nf4", device="meta")
    return bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=bias,
                               has_fp16_weights=False, device="meta")


def quantize_weight(weight: torch.Tensor, kind: str, device: torch.device) -> torch.nn.Parameter:
    """``weight`` (in the compute dtype) quantized on ``device``."""
    bnb = load_bitsandbytes()
    if kind == "nf4":
        param = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
    else:
        param = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    return param._quantize(device) if device.type == "cpu" else param.to(device)


def _swap_in(module: torch.nn.Module, name: str, layer: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(module.get_submodule(parent_name) if parent_name else module, child, layer)


def quantize_linears(module: torch.nn.Module, kind: str, compute_dtype: torch.dtype,
                     device: torch.device, skip: tuple[str, ...]) -> int:
    """Replace the frozen ``nn.Linear`` layers of ``module`` by bitsandbytes' 4-bit (NF4) or
    8-bit ones, quantized on ``device``; returns how many. Done before peft injects: peft wraps
    bitsandbytes layers in its QLoRA layers."""
    found = targets(module, skip)
    for name, linear in found:
        new = bnb_layer(linear, kind, compute_dtype)
        new.weight = quantize_weight(linear.weight.data.to(compute_dtype), kind, device)
        if linear.bias is not None:
            new.bias = torch.nn.Parameter(linear.bias.data.to(device, compute_dtype),
                                          requires_grad=False)
        _swap_in(module, name, new.requires_grad_(False))
    return len(found)


def quantized_storage(kind: str, dtype: torch.dtype, skip: tuple[str, ...]) -> Any:
    """The loader's storage (trainer/models/streamed_load.py) for a meta-built model whose
    Linear layers are quantized as their weights arrive: ``select`` swaps in the empty
    bitsandbytes layers and names their weights; each arriving weight is cast to ``dtype`` and
    quantized on the CPU (the biases load as the other tensors do, in ``dtype``)."""
    from trainer.models.streamed_load import Storage

    def select(model: torch.nn.Module) -> set[str]:
        names = set()
        for name, linear in targets(model, skip):
            _swap_in(model, name, bnb_layer(linear, kind, dtype).requires_grad_(False))
            names.add(f"{name}.weight")
        return names

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype)

    def place(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
        layer = model.get_submodule(name.rpartition(".")[0])
        layer.weight = quantize_weight(convert(tensor), kind, CPU)

    return Storage(select, convert, place)


def set_compute_dtype(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """The run's compute dtype for layers quantized already (by the loader, in the dtype it
    built in); returns how many there are."""
    layers = quantized_layers(module)
    for layer in layers:
        if getattr(layer, "compute_dtype", None) is not None:
            layer.compute_dtype = dtype
    return len(layers)


def place_state(module: torch.nn.Module, device: torch.device,
                moved: Callable[[torch.nn.Parameter], bool] = lambda p: True) -> None:
    """After ``module``'s tensors moved to ``device``: the quantization statistics that
    ``Module.to`` leaves behind follow (NF4's quant_state, int8's ``SCB``, and int8's ``CB``,
    which is the weight itself where ``moved(weight)``, else a device copy of it, as a layer
    quantized on the device holds)."""
    for layer in quantized_layers(module):
        weight = layer.weight
        state = getattr(weight, "quant_state", None)
        if state is not None:
            state.to(device)
        for holder in (weight, getattr(layer, "state", None)):
            if getattr(holder, "SCB", None) is not None:
                holder.SCB = holder.SCB.to(device)
            if getattr(holder, "CB", None) is not None:
                holder.CB = weight.data if moved(weight) else holder.CB.to(device)
