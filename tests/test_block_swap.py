"""Block swap (training.blocks_to_swap, issue 19), its mechanics on the CPU: with a counting
hook, each swapped block of the tiny FLUX.1 transformer and SDXL UNet moves in and out once in
the forward pass (in block order) and once in the backward pass (in reverse order), between
steps its frozen weights are the host copies, and the loss and the adapters' gradients equal
the unswapped run's."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusionXLPipeline
from peft import LoraConfig, inject_adapter_in_model

from trainer.config.files import from_dict
from trainer.models.block_swap import BlockSwapper, swap_units
from trainer.models.loader import resolve_model_path
from trainer.models.memory import MemoryOptionUnavailable, check_memory_options

SWAP = 3


def _flux():
    pipe = FluxPipeline.from_pretrained(str(resolve_model_path("embedded:tiny-flux")),
                                        local_files_only=True)
    model = pipe.transformer
    c = model.config
    gen = torch.Generator().manual_seed(0)
    inputs = dict(hidden_states=torch.randn(2, 16, c.in_channels, generator=gen),
                  timestep=torch.tensor([0.3, 0.7]),
                  encoder_hidden_states=torch.randn(2, 4, c.joint_attention_dim, generator=gen),
                  pooled_projections=torch.randn(2, c.pooled_projection_dim, generator=gen),
                  img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(4, 3), return_dict=False,
                  guidance=torch.tensor([3.5, 3.5]) if c.guidance_embeds else None)
    return model, inputs, ["to_q", "to_k", "proj_mlp"]


def _sdxl():
    pipe = StableDiffusionXLPipeline.from_pretrained(
        str(resolve_model_path("embedded:tiny-sdxl")), local_files_only=True)
    model = pipe.unet
    c = model.config
    gen = torch.Generator().manual_seed(0)
    add = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
    inputs = dict(sample=torch.randn(2, c.in_channels, 8, 8, generator=gen),
                  timestep=torch.tensor([100, 700]),
                  encoder_hidden_states=torch.randn(2, 77, c.cross_attention_dim, generator=gen),
                  added_cond_kwargs={"text_embeds": torch.randn(2, add, generator=gen),
                                     "time_ids": torch.tensor([[64., 64, 0, 0, 64, 64]] * 2)},
                  return_dict=False)
    return model, inputs, ["to_q", "to_k", "conv1"]


def _step(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs)[0].float().pow(2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("build", [_flux, _sdxl])
def test_each_swapped_block_visits_once_per_pass_in_order_and_results_are_equal(build):
    model, inputs, targets = build()
    model.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=targets, init_lora_weights="gaussian"),
                            model)
    model.enable_gradient_checkpointing()
    model.train()
    want_loss, want_grads = _step(model, inputs)
    units = swap_units(model)
    moves: list[tuple[int, str]] = []
    n = min(SWAP, len(units))  # the tiny FLUX.1 has 2 blocks
    swapper = BlockSwapper(units, n, torch.device("cpu"), lambda i, d: moves.append((i, d)))
    first = len(units) - n
    for _ in range(2):
        moves.clear()
        loss, grads = _step(model, inputs)
        assert torch.equal(loss, want_loss)
        assert grads.keys() == want_grads.keys() and grads
        for name, grad in grads.items():
            torch.testing.assert_close(grad, want_grads[name], rtol=0, atol=0)
        swapped = range(first, len(units))
        counts = {(i, d): moves.count((i, d)) for i in swapped for d in ("in", "out")}
        assert set(counts.values()) == {2}, moves  # in and out, forward and backward
        ins = [i for i, d in moves if d == "in"]
        assert ins == list(swapped) + list(reversed(swapped)), moves
        for index in swapped:  # between steps the frozen weights are the host copies
            hosts = {id(h) for _, h in swapper.host[index]}
            frozen = [p for p in units[index].parameters() if not p.requires_grad]
            assert len(frozen) == len(hosts)
            assert all(p.data.data_ptr() in {h.data_ptr() for _, h in swapper.host[index]}
                       for p in frozen)
    swapper.remove()


def test_swap_needs_checkpointing_and_a_device():
    with pytest.raises(ValueError, match="training.gradient_checkpointing"):
        from_dict({"training": {"blocks_to_swap": 2}})
    with pytest.raises(ValueError, match="training.blocks_to_swap"):
        from_dict({"mode": "dreambooth",
                   "training": {"blocks_to_swap": 2, "gradient_checkpointing": True}})
    cfg = from_dict({"training": {"blocks_to_swap": 2, "gradient_checkpointing": True}})
    with pytest.raises(MemoryOptionUnavailable, match="blocks_to_swap = 2 on the CPU backend"):
        check_memory_options(cfg, "cpu", "CPU")
    check_memory_options(cfg, "cuda", "CUDA")
    with pytest.raises(ValueError, match="blocks_to_swap = 9"):
        BlockSwapper([torch.nn.Linear(1, 1)] * 3, 9, torch.device("cpu"))


def test_swapped_weights_are_pinned_from_themselves_unit_by_unit():
    """On CUDA each swapped weight is pinned from the host tensor itself (no copy first), and a
    unit's unpinned weights are let go before the next unit's are pinned, so the set-up holds at
    most one unit twice, not the whole swapped set. No CUDA here: the pin function is the seam
    (a clone stands in for a pinned copy)."""
    model, inputs, _ = _flux()
    model.requires_grad_(False)
    with torch.no_grad():
        want = model(**inputs)[0]
    units = swap_units(model)
    unit_of = {p.data.data_ptr(): i for i, u in enumerate(units) for p in u.parameters()}
    pinned: set[int] = set()
    order: list[int] = []

    def pin(tensor: torch.Tensor) -> torch.Tensor:
        assert tensor.data_ptr() in unit_of  # the weight itself, not a copy of it
        index = unit_of[tensor.data_ptr()]
        order.append(index)
        earlier = [p for u in units[:index] for p in u.parameters()]  # all are swapped
        assert all(p.data.data_ptr() in pinned for p in earlier)  # their unpinned ones gone
        copy = tensor.clone()
        pinned.add(copy.data_ptr())
        return copy

    swapper = BlockSwapper(units, len(units), torch.device("cpu"), pin=pin)
    assert order == sorted(order) and set(order) == set(range(len(units)))
    assert all(p.data.data_ptr() in pinned for u in units for p in u.parameters())
    assert {h.data_ptr() for pairs in swapper.host.values() for _, h in pairs} == pinned
    with torch.no_grad():
        assert torch.equal(model(**inputs)[0], want)
    swapper.remove()
