"""``training.distributed = "fsdp"``: DreamBooth's trained networks sharded over the processes.

With DDP (the default, trainer/system/distributed.py) every process holds the whole model, its
gradients and its optimizer state. A full fine-tune of a model that does not fit one GPU needs
them split: with FSDP each of N processes keeps 1/N of every trained weight, of its gradient and
of its optimizer state, and gathers the whole weights of one block just for that block's forward
and backward (ZeRO-3, "full shard").

**How.** PyTorch's FSDP2, ``torch.distributed.fsdp.fully_shard``, called directly: on each
block of a trained network (the children of its outermost ``ModuleList``\\s: the UNet's down and up
blocks, a transformer's blocks, a text encoder's layers; and the UNet's mid block), then on the
network itself (its embeddings, norms and heads). ``fully_shard`` works in place: the module
keeps its class, names and ``forward``, its parameters become DTensors holding this process's
rows, and hooks gather a block before it runs, free it after, and reduce-scatter (average) its
gradients in the backward. That fits the loop's design, which calls the networks directly
(the family code, the pipelines); the loop only skips its own gradient averaging.
Not through accelerate's FSDP plugin, because in the installed accelerate (1.15):

- on the CPU it is ignored: ``Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
  fsdp_version=2))`` under torchrun keeps ``distributed_type`` MULTI_CPU and ``prepare`` wraps
  the model in DistributedDataParallel (checked with 2 gloo processes), so nothing would test it;
- with ``fsdp_version=2`` ``prepare`` takes one model (``"Only one model is supported when using
  FSDP2"``), and DreamBooth trains the UNet and up to three text encoders with one optimizer.

Every process loads the base model (from the same file: the same weights), the trained networks
stay on the CPU, and ``fully_shard`` moves each block to the device as it shards it: the device
never holds a whole trained network. The optimizer is built on the shards. **Mixed precision**
(``training.mixed_precision``) is FSDP2's policy: the fp32 shards are gathered in bf16 / fp16
and computed in it, the gradients reduced in fp32, outputs handed back in fp32 (what
accelerate's autocast wrapper gives a one-process run); with full_bf16 / full_fp16 the weights
are in that dtype already. Half the bytes of an fp32 gather, but every op of a block runs in
bf16 where autocast keeps norms in fp32: after 3 steps of the tiny model a bf16 FSDP run and a
bf16 one-process run differ by about 10% of the update, as much as either differs from fp32
(fp32 runs agree to about 1e-4). fp16's gradient scaler sees one inf anywhere: DTensor's
dispatch shares the scaler's found-inf flag over the processes (checked on the CPU). Gradient
accumulation reduce-scatters after every backward (accumulating unsharded gradients would hold
whole ones).

**Outputs.** Every collective needs every process: saving, the training state, samples and the
validation loss run on all of them in an FSDP run. :func:`full_model` gathers each sharded
network, tensor by tensor, to the CPU of rank 0 into a copy of the network made before sharding
(its parameters on the meta device, so it costs nothing in between); the method saves that copy,
so the files are the ones a one-process run writes. The training state is gathered likewise
(:func:`gather`: whole tensors, the same files as a DDP state) and resharded on resume
(:func:`put`, :func:`shard_state`). Samples and the validation loss run the sharded networks on
every process (each gathers its blocks in turn); rank 0 writes the images.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch

from trainer.system.distributed import world_size


class FsdpError(ValueError):
    """training.distributed = 'fsdp' where it cannot run; the message says what to set."""


@dataclass
class Sharded:
    """What a run sharded: the model's attribute names and a parameterless copy of each."""

    mesh: Any
    names: list[str]  # "denoiser", "text_encoder", ... (attributes of the BaseModel)
    shells: dict[str, torch.nn.Module]  # the same networks with meta-device parameters


def wanted(cfg: Any) -> bool:
    return cfg.training.distributed == "fsdp"


def check_processes(cfg: Any) -> None:
    """Sharding needs more than one process (known only once the run starts)."""
    if wanted(cfg) and world_size() < 2:
        raise FsdpError("training.distributed = 'fsdp' shards the model over the processes, "
                        "and this run has one: set training.num_processes (one per GPU) or "
                        "more machines, or training.distributed = 'ddp'")


def placement(cfg: Any, device: Any) -> Any:
    """Where set-up puts the networks: the CPU with FSDP (sharding moves them block by block)."""
    return torch.device("cpu") if wanted(cfg) else device


def units(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks that become FSDP units of their own: the children of the outermost
    ModuleLists (UNet down / up blocks, transformer blocks, text-encoder layers) and a UNet's
    mid block; the rest (embeddings, norms, heads) stays with the network's root unit."""
    found: list[torch.nn.Module] = []

    def walk(m: torch.nn.Module) -> None:
        for name, child in m.named_children():
            if isinstance(child, torch.nn.ModuleList):
                found.extend(c for c in child if any(True for _ in c.parameters()))
            elif name == "mid_block" and child is not None:
                found.append(child)
            else:
                walk(child)

    walk(module)
    return found


def _policy(precision: str, trained: torch.dtype, root: bool) -> Any:
    """Gather and compute in the mixed precision, reduce in fp32; the network's (the root
    unit's) output in fp32, the blocks' in the compute dtype for the next block."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if compute is None or trained != torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if root else None)


def _shell(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` whose parameters live on the meta device (buffers are copied)."""
    memo = {id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
            for p in module.parameters()}
    return copy.deepcopy(module, memo)


def _release(shell: torch.nn.Module) -> None:
    """The shell's parameters back to the meta device (the gathered weights are freed)."""
    for m in shell.modules():
        for key, p in m._parameters.items():
            if p is not None:
                m._parameters[key] = torch.nn.Parameter(torch.empty_like(p, device="meta"),
                                                        p.requires_grad)


def shard(s: Any, trained: list[torch.nn.Module], networks: list[torch.nn.Module],
          groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """With FSDP: the untrained networks to the device, the trained ones sharded (``s.fsdp``
    set); returns ``groups`` with the sharded parameters. Without: ``groups`` as they are."""
    if not wanted(s.cfg):
        return groups
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    check_processes(s.cfg)
    device = s.accelerator.device
    for module in networks:
        if module not in trained:
            module.to(device)
    names = {id(m): n for n in ("denoiser", "text_encoder", "text_encoder_2", "text_encoder_3")
             if (m := getattr(s.model, n, None)) is not None}
    before = {id(p): f"{names[id(m)]}.{n}" for m in trained for n, p in m.named_parameters()}
    mesh = init_device_mesh(device.type, (s.accelerator.num_processes,))
    dtype = next(p.dtype for m in trained for p in m.parameters() if p.requires_grad)
    shells = {}
    for module in trained:
        shells[names[id(module)]] = _shell(module)
        for unit in units(module):
            fully_shard(unit, mesh=mesh, mp_policy=_policy(s.precision, dtype, False))
        fully_shard(module, mesh=mesh, mp_policy=_policy(s.precision, dtype, True))
    after = {f"{names[id(m)]}.{n}": p for m in trained for n, p in m.named_parameters()}
    s.fsdp = Sharded(mesh, [names[id(m)] for m in trained], shells)
    return [{**g, "params": [after[before[id(p)]] for p in g["params"]]} for g in groups]


# -- whole tensors and back ---------------------------------------------------------------------
def is_sharded(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def gather(tree: Any, keep: bool) -> Any:
    """``tree`` (dicts, lists, tuples of tensors) with every DTensor gathered whole to the CPU;
    every process must call it, in the same order. ``keep`` off (ranks other than 0): the
    gathered tensors are dropped at once (None in their place)."""
    if isinstance(tree, dict):
        return {k: gather(v, keep) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(gather(v, keep) for v in tree)
    if is_sharded(tree):
        whole = tree.full_tensor().detach().cpu()
        return whole if keep else None
    return tree


def put(param: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy the whole tensor ``whole`` into ``param``, a DTensor shard or a plain tensor."""
    with torch.no_grad():
        param.copy_(like(whole, param))


def like(whole: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``whole`` sharded as ``ref`` is (every process holds ``whole``: no communication); a
    plain ``ref``: ``whole`` on its device."""
    if not is_sharded(ref):
        return whole.to(ref.device)
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(ref.device_mesh.device_type), ref.device_mesh,
                             ref.placements, src_data_rank=None)


def shard_state(state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """A gathered optimizer state dict sharded like ``optimizer``'s parameters (each state
    tensor of a parameter's shape takes the parameter's sharding; step counts stay)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    indices = [i for g in state["param_groups"] for i in g["params"]]
    by_index = dict(zip(indices, params))
    out = {}
    for index, entry in state["state"].items():
        p = by_index[index]
        out[index] = {k: like(v, p) if is_sharded(p) and torch.is_tensor(v)
                      and v.shape == p.shape else v for k, v in entry.items()}
    return {**state, "state": out}


@contextmanager
def full_model(s: Any) -> Iterator[Optional[Any]]:
    """The model with whole trained networks, for saving: ``s.model`` itself without FSDP; with
    it (every process calls this) a copy on rank 0 whose sharded networks are replaced by
    gathered CPU copies, None on the other ranks."""
    sharded: Optional[Sharded] = getattr(s, "fsdp", None)
    if sharded is None:
        yield s.model
        return
    main = s.accelerator.is_main_process
    whole = {}
    for name in sharded.names:
        state = gather(getattr(s.model, name).state_dict(), keep=main)
        if main:
            shell = sharded.shells[name]
            shell.load_state_dict(state, assign=True)
            whole[name] = shell
    try:
        yield dataclasses.replace(s.model, **whole) if main else None
    finally:
        for shell in whole.values():
            _release(shell)
