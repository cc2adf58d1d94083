"""Block swap (``training.blocks_to_swap``): some of the denoiser's blocks live in host memory.

The units are the modules that diffusers' gradient checkpointing runs one at a time: the transformer
blocks of FLUX.1 / SD 3.5 (double then single), Z-Image's main ``layers``, the ResNet and attention
modules of a UNet's down, mid and up blocks. The last ``n`` of them in forward order keep their
frozen weights in host memory (pinned on CUDA, unit by unit: the unpinned weights go as each unit is
pinned) and visit the device twice a step:

- forward: moved in just before the unit runs, out right after (checkpointing saved nothing
  of its weights);
- backward: moved in when checkpointing recomputes the unit, out when the next unit's
  recomputation starts (its backward is done by then) or when the backward pass ends.

Trained parameters (the adapters) never move: the optimizer steps them on the device. Frozen
weights do not change, so moving "out" only drops the device copy and points the parameter
back at its host copy; nothing is copied back. On CUDA the copies in run on a side stream and
the next unit's copy starts while the current one computes. This is what sd-scripts'
``--blocks_to_swap`` does for FLUX.1 and SD 3.5 (its offloader swaps weights between device
and host the same way), written here as hooks on diffusers' modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch

from trainer.system.device import current_stream, on_stream, recorded_event, side_stream


def swap_units(denoiser: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that checkpointing runs one by one, in forward order."""
    if hasattr(denoiser, "transformer_blocks"):
        return list(denoiser.transformer_blocks) + list(
            getattr(denoiser, "single_transformer_blocks", None) or [])
    if isinstance(getattr(denoiser, "layers", None), torch.nn.ModuleList):
        return list(denoiser.layers)  # a single-stream DiT's main layers (Z-Image)
    units: list[torch.nn.Module] = []
    blocks = list(denoiser.down_blocks) + [denoiser.mid_block] + list(denoiser.up_blocks)
    for block in blocks:
        resnets = list(getattr(block, "resnets", None) or [])
        attentions = list(getattr(block, "attentions", None) or [])
        if block is denoiser.mid_block:  # mid: resnet, (attention, resnet)*
            units.append(resnets[0])
            for attention, resnet in zip(attentions, resnets[1:]):
                units += [attention, resnet]
            continue
        for i, resnet in enumerate(resnets):
            units.append(resnet)
            if i < len(attentions):
                units.append(attentions[i])
    return units


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def pin_memory(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned (page-locked) copy of a host tensor: what CUDA copies from asynchronously."""
    return tensor.pin_memory()


class BlockSwapper:
    """Hooks that move the frozen weights of ``units[-n:]`` between host and ``device``.

    ``on_move(index, direction)`` is called at every move ("in" / "out"; the tests count them).
    ``pin``: how a host weight is pinned (:func:`pin_memory` on CUDA, none elsewhere); each
    unit's weights are pinned and their unpinned tensors let go before the next unit's, so the
    set-up holds at most one unit twice.
    """

    def __init__(self, units: list[torch.nn.Module], n: int, device: torch.device,
                 on_move: Optional[Callable[[int, str], None]] = None,
                 pin: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        if not 1 <= n <= len(units):
            raise ValueError(f"training.blocks_to_swap = {n}: this model has {len(units)} "
                             f"blocks that can be swapped; set 1 to {len(units)}")
        self.device = torch.device(device)
        self.first = len(units) - n
        self.units = units
        self.on_move = on_move
        self.cuda = self.device.type == "cuda"
        self.pin = pin or (pin_memory if self.cuda else None)
        self.stream = side_stream(self.device) if self.cuda else None
        self.host: dict[int, list[tuple[torch.nn.Parameter, torch.Tensor]]] = {}
        self.ready: dict[int, Any] = {}  # index -> the copy's event (CUDA) or True
        self.pending: Optional[int] = None  # recomputed in backward, waiting to go out
        self.queued = False
        self.handles: list[Any] = []
        for index in range(self.first, len(units)):
            self.host[index] = self._host_copies(units[index])
            self.handles.append(units[index].register_forward_pre_hook(
                lambda m, a, i=index: self._before(i)))
            self.handles.append(units[index].register_forward_hook(
                lambda m, a, o, i=index: self._after(i)))

    def _host_copies(self, unit: torch.nn.Module) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        pairs = []
        for param in unit.parameters():
            if param.requires_grad:
                param.data = param.data.to(self.device)
                continue
            host = param.data.to("cpu")  # the weight itself where it is on the host already
            if self.pin is not None:
                host = self.pin(host)
            param.data = host  # the unpinned tensor goes (a view's buffer with its unit)
            pairs.append((param, host))
        for buffer_owner in unit.modules():
            for name, buf in list(buffer_owner._buffers.items()):
                if buf is not None:
                    buffer_owner._buffers[name] = buf.to(self.device)
        return pairs

    def remove(self) -> None:
        """Take the hooks off and bring every unit to the device (e.g. for a full save)."""
        for handle in self.handles:
            handle.remove()
        for index in self.host:
            self._wait(index) if index in self.ready else self._wait(self._start(index))

    # --- moves -------------------------------------------------------------------------------

    def _start(self, index: int) -> int:
        """Begin the copy in of ``index`` (on the side stream on CUDA)."""
        if index in self.ready or index not in self.host:
            return index
        if self.on_move:
            self.on_move(index, "in")
        if self.cuda:
            with on_stream(self.stream):
                for param, host in self.host[index]:
                    param.data = host.to(self.device, non_blocking=True)
                event = recorded_event(self.stream)
            self.ready[index] = event
        else:
            for param, host in self.host[index]:
                param.data = host.to(self.device, copy=True)
            self.ready[index] = True
        return index

    def _wait(self, index: int) -> None:
        event = self.ready.get(index)
        if self.cuda and event is not None and event is not True:
            current = current_stream(self.device)
            current.wait_event(event)
            for param, _ in self.host[index]:
                param.data.record_stream(current)
            self.ready[index] = True

    def _out(self, index: int) -> None:
        if index not in self.ready:
            return
        if self.on_move:
            self.on_move(index, "out")
        for param, host in self.host[index]:
            param.data = host
        del self.ready[index]

    # --- hooks -------------------------------------------------------------------------------

    def _before(self, index: int) -> None:
        backward = _in_backward()
        if backward:
            if self.pending is not None and self.pending != index:
                self._out(self.pending)
            if not self.queued:
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
                self.queued = True
        self._wait(self._start(index))
        neighbour = index - 1 if backward else index + 1
        if neighbour in self.host:
            self._start(neighbour)  # prefetch: the copy overlaps this unit's compute

    def _after(self, index: int) -> None:
        if _in_backward():
            self.pending = index  # its backward runs now; out when the next one recomputes
        else:
            self._out(index)

    def _backward_done(self) -> None:
        if self.pending is not None:
            self._out(self.pending)
        self.pending = None
        self.queued = False
        for index in list(self.ready):  # a prefetch that no unit used
            self._out(index)
