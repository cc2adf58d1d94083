"""FLUX.2's shared modulations in bf16 where their fp32 weights are bf16 values
(trainer/families/flux2/shared_weights.py): the same numbers bit for bit at half the bytes,
nothing else touched, installed by the family's call."""

from __future__ import annotations

import pytest
import torch
from test_flux2_last_block import adapted, step

from trainer.config import ModelSection
from trainer.families import family
from trainer.families.flux2.shared_weights import SHARED, keep_bf16
from trainer.models.loader import load_base_model

pytestmark = pytest.mark.usefixtures("no_network")


def as_bf16_file(model):
    """Every fp32 weight rounded to a bf16 value, as an fp32 run of a bf16 file holds it."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == torch.float32:
                p.copy_(p.to(torch.bfloat16).float())
    return model


def shared_bytes(model) -> int:
    return sum(model.get_submodule(name).weight.nbytes for name in SHARED)


def test_the_same_numbers_at_half_the_bytes():
    kept, plain = as_bf16_file(adapted()), as_bf16_file(adapted())
    before = shared_bytes(kept)
    assert keep_bf16(kept) == len(SHARED) == 4
    assert shared_bytes(kept) * 2 == before
    assert all(kept.get_submodule(n).weight.dtype == torch.bfloat16 for n in SHARED)
    assert kept.dtype == torch.float32  # what the pipeline casts its inputs to
    got, expected = step(kept), step(plain)
    assert len(got) == len(expected) > 2 and all(map(torch.equal, got, expected))
    assert keep_bf16(kept) == 0  # stored once


def test_weights_that_would_lose_something_or_are_not_plain_stay():
    model = adapted()  # random fp32 weights: not bf16 values
    assert keep_bf16(model) == 0
    model = as_bf16_file(adapted())
    trained = model.get_submodule(SHARED[0]).requires_grad_(True)
    hooked = model.get_submodule(SHARED[1])
    hooked.register_forward_pre_hook(lambda module, args: None)
    replaced = model.get_submodule(SHARED[2])
    replaced.forward = replaced.forward  # as LyCORIS replaces it
    stored = model.get_submodule(SHARED[3]).to(torch.bfloat16)
    assert keep_bf16(model) == 0
    assert trained.weight.dtype == hooked.weight.dtype == replaced.weight.dtype == torch.float32
    assert stored.weight.dtype == torch.bfloat16 and "forward" not in vars(stored)


def test_the_family_call_stores_them_once_the_base_is_frozen():
    """A call before the run froze the base (the CPU's precision probe runs one) decides
    nothing; the first call after it stores them."""
    model = load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-flux2"))
    as_bf16_file(model.denoiser)
    g = torch.Generator().manual_seed(1)
    noisy = torch.randn(1, model.vae.config.latent_channels, 8, 8, generator=g)

    def call():
        with torch.no_grad():
            text = family("flux2").encode(model, ["a red circle"], clip_skip=1)
            family("flux2").predict(model, noisy, torch.tensor([0.6]), text, None)
        return {model.denoiser.get_submodule(n).weight.dtype for n in SHARED}

    model.denoiser.requires_grad_(True)
    assert call() == {torch.float32}
    model.denoiser.requires_grad_(False)
    assert call() == {torch.bfloat16}
    assert keep_bf16(model.denoiser) == 0  # decided
