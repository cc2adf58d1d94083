"""fp8 base weights on every kernel path (issue 28).

A layer stored in fp8 computes from a copy in the compute dtype (trainer/models/memory.py:
ComputeCopies). What autograd saves for the backward pass must be that copy, never the fp8
parameter: a convolution saves its weight as it is, so with a cast-in-place hook its backward
met fp8 wherever autocast had not copied the weight first (fp32 compute, or bf16 on a CPU
without bf16 units). The family matrix runs on this CPU's own kernels and, in a subprocess,
on the AVX2 kernels that a CPU without bf16 units takes (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2``), so both kinds of CPU are covered on either kind of machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from torch.utils.checkpoint import checkpoint

from trainer.methods.fast_lora import lean_forward
from trainer.models.memory import FP8, store_fp8

HERE = Path(__file__).parent
FAMILIES = ["sd1", "sdxl", "flux1", "sd3"]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


class Block(torch.nn.Module):
    """A conv, a Linear behind a LoRA (peft's, with the lean forward) and a plain Linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.to_q = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 4, bias=False)

    def forward(self, x):
        h = self.conv(x).permute(0, 2, 3, 1)
        return self.out(torch.nn.functional.gelu(self.to_q(h)))


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_saves_the_compute_copies_never_the_fp8_weights(dtype, checkpointing):
    torch.manual_seed(0)
    block = Block().to(dtype).requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["to_q"]), block)
    assert lean_forward(block) == 1
    for p in block.parameters():
        p.requires_grad_("lora_" in str(p.shape) or p.dtype == dtype and p.requires_grad)
    stored = store_fp8(block, dtype)
    assert stored == 3  # the conv, the LoRA's base layer and the plain Linear
    params = dict(block.named_parameters())
    saved: list[torch.dtype] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.dtype)
        assert not any(t is p for p in params.values()), "autograd saved a stored parameter"
        return t

    x = torch.randn(2, 4, 6, 6, dtype=dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
        y.float().square().mean().backward()
    assert saved and FP8 not in saved
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    lora_b = params["to_q.lora_B.default.weight"]
    assert lora_b.grad is not None and lora_b.grad.abs().sum() > 0
    # the stored weights are the same fp8 parameters after the step, adapters unchanged
    assert dict(block.named_parameters()) == params
    assert params["conv.weight"].dtype == FP8 and params["to_q.base_layer.weight"].dtype == FP8
    assert params["to_q.lora_A.default.weight"].dtype == dtype


def test_a_forward_that_raises_puts_the_stored_weights_back():
    layer = torch.nn.Linear(4, 4).requires_grad_(False)
    store_fp8(layer, torch.float32)
    weight = layer.weight
    with pytest.raises(RuntimeError):
        layer(torch.randn(2, 5))  # wrong width
    assert layer.weight is weight and layer.weight.dtype == FP8
    assert layer(torch.randn(2, 4)).dtype == torch.float32


@pytest.fixture(scope="module", params=["this-cpu", "avx2"])
def matrix(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    """Each family x precision x checkpointing trained for one step with fp8 base weights, in
    one subprocess per kernel path: {family: {combination: 'finished' or the error}}."""
    work = tmp_path_factory.mktemp(f"fp8-{request.param}")
    out = work / "matrix.json"
    cmd = [sys.executable, str(HERE / "fp8_matrix.py"), ",".join(FAMILIES), str(work), str(out)]
    env = {**os.environ, **(AVX2 if request.param == "avx2" else {})}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_base_trains_every_family_in_every_precision(matrix, family):
    results = matrix[family]
    assert len(results) == 6, results  # (no, bf16, auto) x (checkpointing off, on)
    assert all(r == "finished" for r in results.values()), results
