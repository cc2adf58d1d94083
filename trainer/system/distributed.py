"""More than one process (DDP through accelerate): what the loop needs beyond one process.

A run with ``training.num_processes > 1`` is started by :mod:`trainer.run.launch` (torchrun); every
process runs the same loop on its share of each batch. The design, and why:

* **The data.** Each epoch is planned as one process would plan it with the *global* batch
  (``train_batch_size x processes``); process ``r`` trains rows ``r*b .. r*b+b`` of every global
  batch (``trainer.data.sampler.shard_rows``), so the shards joined are the one-process epoch.
* **The random streams.** Every process holds the same seed and draws the noise and timesteps of
  the whole global batch, then keeps its rows (:func:`widen`, :func:`narrow`). So a sample gets
  the same noise and timestep as in a one-process run with the global batch, and 2 processes x
  batch 1 train what 1 process x batch 2 trains (up to float rounding).
* **The gradients.** After the backward pass of an optimizer step the gradients of the trained
  parameters are averaged over the processes with all-reduce (:func:`average_gradients`).
  The modules are not wrapped in ``DistributedDataParallel``: the trained parameters (LoRA
  layers, an embedding) live inside the UNet and the text encoders, which the model families
  call directly, and DDP's hooks only sync when its wrapper's ``forward`` runs.
* **Mixed precision.** One process gets autocast (and fp32 outputs) on the trained modules
  from accelerate's ``prepare``; with more, ``prepare_model(evaluation_mode=True)`` gives them
  the same without the DDP wrapper (trainer/run/session.py), so a bf16 DreamBooth trains fp32
  weights under autocast here too.
* **Rank 0** alone writes files, samples, states, validation and events; Stop is rank 0's
  decision, broadcast at each step boundary so that every process stops at the same step.
* **FSDP** (``training.distributed = "fsdp"``, trainer/run/fsdp.py) shards DreamBooth's trained
  networks instead: FSDP's hooks reduce-scatter the gradients (:func:`average_gradients` and
  :func:`check_in_step` are skipped), and every process takes part in saves, samples and
  validation, whose weights must be gathered; rank 0 still writes alone.

With one process nothing here runs: every helper returns at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any, Optional

import torch

# The rows of a process's share of a global batch: (first, end, global batch size).
Rows = tuple[int, int, int]


def world_size() -> int:
    """Processes in this run, from the launcher's environment (1 outside a launch)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def main_process_first(info: Any):
    """Rank 0 runs the block first (e.g. builds the embedded model, generates class images),
    the others wait and follow. ``info``: the DeviceInfo (on the CPU the group is gloo's)."""
    if world_size() == 1:
        return contextlib.nullcontext()
    from accelerate import PartialState

    return PartialState(cpu=info.backend == "cpu").main_process_first()


def widen(latents: torch.Tensor, rows: Optional[Rows]) -> torch.Tensor:
    """This process's latents placed at their rows of the global batch (zeros elsewhere), so
    that the random draws made from its shape are the one-process run's."""
    if rows is None:
        return latents
    first, end, size = rows
    full = latents.new_zeros((size, *latents.shape[1:]))
    full[first:end] = latents
    return full


def narrow(rows: Optional[Rows], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """This process's rows of tensors shaped like the global batch."""
    if rows is None:
        return tensors
    first, end, _ = rows
    return tuple(t[first:end] for t in tensors)


def average_gradients(params: Sequence[torch.nn.Parameter], acc: Any,
                      bucket: int = 1 << 24) -> None:
    """Average the gradients over the processes: one all-reduce per ``bucket`` elements, in
    place (a parameter without a gradient takes part with zeros, so every process sends the
    same layout)."""
    if acc.num_processes == 1:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for group in _buckets([p.grad for p in params], bucket):
        flat = torch.cat([g.reshape(-1) for g in group])
        dist.all_reduce(flat)
        flat /= acc.num_processes
        offset = 0
        for g in group:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def _buckets(grads: list[torch.Tensor], size: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of same-dtype gradients of about ``size`` elements each."""
    out: list[list[torch.Tensor]] = []
    count = 0
    for g in grads:
        if not out or count + g.numel() > size or out[-1][0].dtype != g.dtype:
            out.append([])
            count = 0
        out[-1].append(g)
        count += g.numel()
    return out


def mean_loss(loss: torch.Tensor, acc: Any) -> float:
    """The loss of the global batch: the processes' losses averaged (the one-process value)."""
    if acc.num_processes == 1:
        return loss.item()
    import torch.distributed as dist

    value = loss.detach().float().reshape(1).clone()
    dist.all_reduce(value)
    return value.item() / acc.num_processes


def stop_agreed(requested: bool, acc: Any) -> bool:
    """Rank 0's stop request, shared so that every process stops at the same step."""
    if acc.num_processes == 1:
        return requested
    import torch.distributed as dist

    flag = torch.tensor([1.0 if requested else 0.0], device=acc.device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def check_in_step(params: Sequence[torch.nn.Parameter], acc: Any, step: int) -> None:
    """Debug check (env ``TRAINER_DDP_CHECK=1``): the trained weights are the same on every
    process after each step; raises when they are not (the all-reduce did not happen)."""
    if acc.num_processes == 1 or os.environ.get("TRAINER_DDP_CHECK") != "1":
        return
    import torch.distributed as dist

    local = torch.cat([p.detach().reshape(-1).double() for p in params]).to(acc.device)
    mine = local.clone()
    dist.broadcast(local, src=0)
    if not torch.equal(local, mine):
        raise RuntimeError(f"the trained weights differ between processes after step {step} "
                           f"(rank {acc.process_index})")


def broadcast_params(modules: Sequence[torch.nn.Module], acc: Any) -> None:
    """Every process starts from rank 0's trained weights (they are seeded alike anyway)."""
    import torch.distributed as dist

    with torch.no_grad():
        for module in modules:
            for p in module.parameters():
                if p.requires_grad:
                    dist.broadcast(p.data, src=0)
