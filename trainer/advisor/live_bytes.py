"""Measuring a step on the meta device: :class:`LiveBytes` follows every tensor a step creates
until it is freed (its peak is the step's own memory) and counts the matmuls' and convolutions'
floating-point operations (torch.utils.flop_counter's formulas) in a :class:`Work`;
:class:`FusedAttention` stands in for fused SDPA kernels (output and one log-sum-exp per row
kept, never the N x N scores that the meta device's unfused fallback would hold)."""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.advisor.law import Recording

# A fused attention backward recomputes the scores: about 2.5 forwards of work (Dao 2023,
# "FlashAttention-2", section 3.1.2 counts 5 matmuls backward against 2 forward).
ATTENTION_BACKWARD = 2.5


class Work:
    """Floating-point operations a step runs: the total and, for a law (:mod:`law`), each
    count in order with its multiplier."""

    def __init__(self, log: Optional[list] = None):
        self.total, self.log = 0.0, log

    def add(self, count: int, times: float = 1.0) -> None:
        self.total += count * times
        if self.log is not None:
            self.log.append((int(count), times))


def _shapes(value: Any) -> Any:
    """``value`` with each tensor replaced by its shape (what the flop formulas read)."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (tuple, list)):
        return type(value)(_shapes(v) for v in value)
    if isinstance(value, dict):
        return {k: _shapes(v) for k, v in value.items()}
    return value


def _flop_formulas() -> dict[Any, Any]:
    """torch.utils.flop_counter's formulas on shapes (FlopCounterMode's own tree maps hold
    tensors in reference cycles, which would count as memory)."""
    if not _FORMULAS:
        from torch.utils.flop_counter import flop_registry

        _FORMULAS.update({op: f.__wrapped__ for op, f in flop_registry.items()
                          if hasattr(f, "__wrapped__")})
    return _FORMULAS


_FORMULAS: dict[Any, Any] = {}


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors created under it that are still alive, and their peak. A
    storage counts once however many views share it; ``ignore`` holds the storages of tensors
    that existed before (weights, inputs). With ``work``, the matmuls' and convolutions'
    floating-point operations are counted there; with ``record``, each storage's bytes and
    the order of their appearing and freeing are kept (:class:`law.Recording`)."""

    def __init__(self, ignore: set[int], work: Optional[Work] = None,
                 record: Optional[Recording] = None):
        super().__init__()
        self.ignore, self.live, self.peak, self.ops = ignore, 0, 0, 0
        self.work, self.record = work, record
        self._refs: dict[int, list[int]] = {}
        self._formulas = _flop_formulas() if work is not None else {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(func._overloadpacket)
        if formula is not None:
            self.work.add(formula(*_shapes(args), out_shape=_shapes(out), **_shapes(kwargs)))
        self._track_all(out)
        return out

    def _track_all(self, value: Any) -> None:
        # not torch's tree_flatten: its recursive closure is a reference cycle that would keep
        # the outputs alive until the garbage collector runs, and count them as held
        if isinstance(value, torch.Tensor):
            self._track(value)
        elif isinstance(value, (tuple, list)):
            for item in value:
                self._track_all(item)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.ignore:
            return
        entry = self._refs.get(key)
        if entry is None:
            entry = self._refs[key] = [0, storage.nbytes(), -1]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
            if self.record is not None:
                entry[2] = len(self.record.sizes)
                self.record.sizes.append(entry[1])
                self.record.timeline.append(entry[2])
        entry[0] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]
            if self.record is not None:
                self.record.timeline.append(~entry[2])


class _FusedAttention(torch.autograd.Function):
    """Shapes and saved tensors of a fused SDPA kernel, on meta tensors."""

    @staticmethod
    def forward(ctx, q, k, v, work):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.work = work
        ctx.count = 4 * q.shape[:-1].numel() * k.shape[-2] * q.shape[-1]
        work.add(ctx.count)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        ctx.work.add(ctx.count, ATTENTION_BACKWARD)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


class FusedAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to :class:`_FusedAttention` in this thread;
    its work is counted in ``work``."""

    def __init__(self, work: Optional[Work] = None):
        super().__init__()
        self.work = work or Work()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            kwargs = kwargs or {}  # diffusers' attention dispatch passes them by name
            q, k, v = args[:3] if len(args) >= 3 else (kwargs["query"], kwargs["key"],
                                                       kwargs["value"])
            return _FusedAttention.apply(q, k, v, self.work)
        return func(*args, **(kwargs or {}))


def _checkpoint_func(work: Optional[Work] = None):
    """diffusers' gradient checkpointing, whose recomputation sees the fused attention too."""
    from torch.utils.checkpoint import checkpoint

    work = work or Work()

    def run(module, *args):
        def block(*inner):
            with FusedAttention(work):
                return module(*inner)
        return checkpoint(block, *args, use_reentrant=False)
    return run
