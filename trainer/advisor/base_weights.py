"""The frozen UNet's device bytes under the memory options for SD 1.x, 2.x and SDXL,
as trainer/models/memory.py applies them (FLUX.1 and SD 3.5: trainer/advisor/flow_memory.py):

- ``model.base_precision = "fp8"``: the Linear and Conv weights that
  :func:`trainer.models.memory.store_fp8` casts take 1 byte; the rest (norms, the skipped
  embedders and first and last convolutions) stays at the compute precision. Each layer is
  computed from a copy at the compute precision, and autograd keeps those copies for the
  backward pass: with gradient checkpointing one block's worth at a time, without it every
  cast layer's (measured: a stack of frozen bf16 Linears behind an input that needs its gradient
  grew by the whole stack's bf16 size in its forward with fp8 storage, by nothing without), so
  fp8 storage saves memory in training only with checkpointing on;
- ``"nf4"`` / ``"int8"``: the frozen Linear weights in 4 bits plus an absmax per 64 / 8 bits
  plus a row scale; the UNet's convolutions stay at the compute precision;
- ``training.blocks_to_swap = N``: the last N of :func:`trainer.models.block_swap.swap_units`
  leave the device but for the two in flight (the running one and the prefetched one).

The counts come from the UNet built on the meta device, once per model shape (kept on disk),
and ship for the families' models beside their laws (``python -m trainer.advisor.make_shipped
--base-weights``, seconds; tests/test_advisor_base_weights.py says when they are stale).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Optional

from trainer.advisor.disk_cache import stored

NF4_BYTES = 0.5 + 4 / 64  # a 4-bit code and an fp32 absmax per block of 64
INT8_BYTES = 1.0


@dataclass(frozen=True)
class UnetWeights:
    """Parameter counts of a UNet, by what the memory options do with them."""

    total: int
    units: tuple[int, ...]  # parameters of each swap unit, in forward order
    fp8_units: tuple[int, ...]  # of those, the ones fp8 storage casts
    quant_units: tuple[int, ...]  # of those, the Linear weights NF4 / int8 quantize
    fp8_other: int  # cast outside the units (the time embedding, the down/upsamplers)
    quant_other: int


def weights_key(configs: Any) -> str:
    return json.dumps(["unet-base-weights", configs.key], sort_keys=True)


def unet_weights(configs: Any) -> UnetWeights:
    """The counts for ``configs`` (a :class:`trainer.advisor.model_configs.ModelConfigs`):
    shipped for the families' models (trainer/advisor/make_shipped.py), else counted once."""
    return stored(weights_key(configs), lambda: count_unet(configs), asdict,
                  lambda d: UnetWeights(**{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in d.items()}), model=configs.key)


def count_unet(configs: Any) -> UnetWeights:
    """Counts the UNet built on the meta device (imports diffusers)."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import UNet2DConditionModel

    from trainer.models.block_swap import swap_units
    from trainer.models.memory import SKIP_PATTERNS

    with init_empty_weights(include_buffers=True):
        unet = UNet2DConditionModel.from_config(configs.unet)
    unit_of = {id(p): i for i, unit in enumerate(swap_units(unet)) for p in unit.parameters()}
    count = len(set(unit_of.values()))
    rows = [[0, 0, 0] for _ in range(count + 1)]  # the last row: outside the units
    for name, module in unet.named_modules():
        layer = isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and not any(
            re.search(p, name) for p in SKIP_PATTERNS)
        for pname, p in module.named_parameters(recurse=False):
            row = rows[unit_of.get(id(p), count)]
            row[0] += p.numel()
            row[1] += p.numel() if layer else 0
            row[2] += p.numel() if layer and type(module) is torch.nn.Linear \
                and pname == "weight" else 0
    units = rows[:count]
    return UnetWeights(sum(r[0] for r in rows), tuple(r[0] for r in units),
                       tuple(r[1] for r in units), tuple(r[2] for r in units),
                       rows[count][1], rows[count][2])


def _bytes(n: int, cast: int, quant: int, base: str, itemsize: int) -> float:
    if base == "fp8":
        return itemsize * (n - cast) + cast
    if base in ("nf4", "int8"):
        return itemsize * (n - quant) + (NF4_BYTES if base == "nf4" else INT8_BYTES) * quant
    return itemsize * n


def device_bytes(w: UnetWeights, base: str, swap: Optional[int], itemsize: int) -> int:
    """Bytes of the frozen UNet on the device, weights at ``itemsize`` bytes where they are not
    stored in fewer."""
    units = [_bytes(n, c, q, base, itemsize)
             for n, c, q in zip(w.units, w.fp8_units, w.quant_units)]
    other = _bytes(w.total - sum(w.units), w.fp8_other, w.quant_other, base, itemsize)
    swapped = min(swap or 0, len(units))
    resident, away = units[:len(units) - swapped], units[len(units) - swapped:]
    return int(other + sum(resident) + sum(sorted(away, reverse=True)[:2]))


def compute_copies(w: UnetWeights, base: str, itemsize: int, checkpointing: bool) -> int:
    """Bytes of the compute-precision copies fp8 storage keeps for the backward pass."""
    if base != "fp8":
        return 0
    cast = max(w.fp8_units, default=0) if checkpointing else sum(w.fp8_units) + w.fp8_other
    return int(itemsize * cast)
