"""Tensors computed from one file tensor, replayed on the real one.

diffusers' OpenCLIP conversion (SD 2.x's text encoder, SDXL's bigG) makes new tensors: q, k and
v are ``in_proj_weight[a:b].clone().detach()`` and the projection is ``text_projection.T
.contiguous()``. On meta tensors these have no ``_base`` that leads back to the file, so
streamed_load could not stream them. :class:`Recorder`, a torch function mode active while the
conversion runs, notes for every tensor computed from a tracked one the call that made it; a
converted tensor is then rebuilt by reading its file tensor and replaying those calls, so the
result is bit for bit what the conversion computes on the real dict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map


class Recorder(TorchFunctionMode):
    """Records ``(func, args, kwargs, index)`` of each meta tensor computed from a tracked one
    (the file's meta tensors, then what was computed from them) while ``active``."""

    def __init__(self, tracked: set[int]) -> None:
        super().__init__()
        self.tracked = set(tracked)
        self.recipes: dict[int, tuple[Any, tuple, dict, Optional[int], torch.Tensor]] = {}
        self.active = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.active or not any(isinstance(t, torch.Tensor) and id(t) in self.tracked
                                      for t in tree_flatten((args, kwargs))[0]):
            return out
        outputs = [(None, out)] if isinstance(out, torch.Tensor) else (
            list(enumerate(out)) if isinstance(out, (tuple, list)) else [])
        for index, tensor in outputs:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
                # the tensor is kept, so that its id is not reused by another
                self.recipes[id(tensor)] = (func, args, kwargs, index, tensor)
                self.tracked.add(id(tensor))
        return out

    def knows(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and id(value) in self.recipes

    def replay(self, value: torch.Tensor, read: Callable[[int], Optional[torch.Tensor]]
               ) -> torch.Tensor:
        """The real tensor for ``value``: ``read(id)`` for a file tensor, else its recipe
        replayed on real inputs."""
        source = read(id(value))
        if source is not None:
            return source
        func, args, kwargs, index, _ = self.recipes[id(value)]

        def real(item: Any) -> Any:
            if isinstance(item, torch.Tensor) and item.device.type == "meta":
                return self.replay(item, read)
            return item

        was, self.active = self.active, False
        try:
            out = func(*tree_map(real, args), **tree_map(real, kwargs))
        finally:
            self.active = was
        return out if index is None else out[index]
