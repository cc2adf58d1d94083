"""FLUX.2's SwiGLU through trainer/families/common/swiglu.py: diffusers' ``Flux2SwiGLU``
numbers bit for bit, one N x H tensor less kept for the backward, installed on the transformer
by the family's call."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2SwiGLU

from trainer.config import ModelSection
from trainer.families import family
from trainer.families.common.swiglu import halves_swiglu, lean_swiglu
from trainer.models.loader import load_base_model

pytestmark = pytest.mark.usefixtures("no_network")


def forward_backward(fn, x, grad):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    out.backward(grad)
    return out.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_same_numbers_as_diffusers_swiglu(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 7, 24, generator=g) * 3).to(dtype)
    grad = torch.randn(2, 7, 12, generator=g).to(dtype)
    expected = forward_backward(Flux2SwiGLU(), x, grad)
    got = forward_backward(halves_swiglu, x, grad)
    assert all(map(torch.equal, got, expected))
    # a non-contiguous input (a slice of a fused projection, as in the single blocks)
    wide = torch.randn(2, 7, 40, generator=g).to(dtype)[..., 8:32]
    assert all(map(torch.equal, forward_backward(halves_swiglu, wide, grad),
                   forward_backward(Flux2SwiGLU(), wide, grad)))


def saved_bytes(fn, x) -> int:
    """The bytes of the storages that autograd keeps for ``fn(x)``'s backward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = x.detach().clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(storages.values())


def test_one_tensor_of_the_output_size_less_is_kept():
    x = torch.randn(1, 64, 48)
    kept, diffusers_kept = saved_bytes(halves_swiglu, x), saved_bytes(Flux2SwiGLU(), x)
    assert kept == x.numel() * 4
    assert diffusers_kept - kept == 64 * 24 * 4  # silu(a)


def test_the_family_call_installs_it_and_the_step_is_unchanged():
    model = load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-flux2"))
    plain = copy.deepcopy(model.denoiser)
    swiglus = [m for m in model.denoiser.modules() if type(m) is Flux2SwiGLU]
    assert swiglus and all(m.forward is not halves_swiglu for m in swiglus)
    g = torch.Generator().manual_seed(1)
    noisy = torch.randn(1, model.vae.config.latent_channels, 8, 8, generator=g)
    sigma = torch.tensor([0.6])

    def step(denoiser):
        model.denoiser = denoiser
        denoiser.zero_grad(set_to_none=True)
        denoiser.requires_grad_(True)
        with torch.no_grad():
            text = family("flux2").encode(model, ["a red circle"], clip_skip=1)
        out = family("flux2").predict(model, noisy, sigma, text, None)
        out.pow(2).mean().backward()
        return [out.detach()] + [p.grad for p in denoiser.parameters()]

    lean = step(model.denoiser)
    assert all(m.forward is halves_swiglu for m in swiglus)
    assert lean_swiglu(model.denoiser, Flux2SwiGLU) == 0  # once
    expected = step(plain)
    assert len(lean) == len(expected) and all(map(torch.equal, lean, expected))
