"""Z-Image's own numbers on its tiny twin: the conditioning equals ``ZImagePipeline.
encode_prompt``'s, the family's denoiser call equals the pipeline's transformer call (the same
timestep and the negation the pipeline applies), and the registry detects its folder."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelSection
from trainer.families import detect_path, family
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
CAPTIONS = ["a red circle on blue", "a shape"]


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-zimage"))


def pipeline(model):
    return family("zimage").pipeline(model, model.denoiser, model.noise_scheduler)


def test_the_tiny_twin_is_a_zimage_pipeline_folder(model):
    folder = resolve_model_path("embedded:tiny-zimage")
    assert detect_path(folder).family == "zimage"
    assert model.version == "zimage" and model.variant == "turbo"
    assert type(model.text_encoder).__name__ == "Qwen3Model"
    assert not model.noise_scheduler.config.use_dynamic_shifting
    assert model.noise_scheduler.config.shift == 3.0


def test_conditioning_equals_the_pipelines_encode_prompt(model):
    text = family("zimage").encode(model, list(CAPTIONS), clip_skip=1)
    with torch.no_grad():
        expected, _ = pipeline(model).encode_prompt(list(CAPTIONS), device="cpu",
                                                    do_classifier_free_guidance=False)
    assert text.mask is not None and text.lengths() == [e.shape[0] for e in expected]
    assert text.lengths()[0] != text.lengths()[1]  # captions of their own lengths
    for row, want in zip(text.rows(), expected):
        torch.testing.assert_close(row, want, rtol=0, atol=0)
    # padding is zeros after each caption
    short = min(range(2), key=lambda i: text.lengths()[i])
    assert not text.hidden[short, text.lengths()[short]:].any()


def test_predict_equals_the_pipelines_transformer_call(model):
    """The pipeline at scheduler timestep t gives the DiT (1000 - t) / 1000 and negates its
    output; our sigma is t / 1000, and the flow objective's target is noise - latents."""
    torch.manual_seed(0)
    noisy = torch.randn(2, 16, 8, 8)
    t_sched = torch.tensor([750.0, 250.0])
    text = family("zimage").encode(model, list(CAPTIONS), clip_skip=1)
    with torch.no_grad():
        embeds, _ = pipeline(model).encode_prompt(list(CAPTIONS), device="cpu",
                                                  do_classifier_free_guidance=False)
        ours = family("zimage").predict(model, noisy, t_sched / 1000, text, None)
        frames = list(noisy.unsqueeze(2).unbind(dim=0))
        out = model.denoiser(frames, (1000 - t_sched) / 1000, embeds, return_dict=False)[0]
        theirs = -torch.stack([o.float() for o in out], dim=0).squeeze(2)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # the sign: at sigma 1 (pure noise) the velocity points from the latents to the noise
    assert ours.shape == noisy.shape


def test_block_swap_moves_the_main_layers_and_changes_nothing(model):
    """training.blocks_to_swap on Z-Image: its units are the main ``layers``; each swapped
    one visits twice a step (forward, recomputation) and the loss and gradients are equal."""
    from peft import LoraConfig, inject_adapter_in_model

    from trainer.families.zimage.lora import target_modules
    from trainer.families.zimage.tiny import build_zimage_components
    from trainer.models.block_swap import BlockSwapper, swap_units

    transformer = build_zimage_components()["transformer"].requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=2, target_modules=target_modules(transformer),
                                       init_lora_weights="gaussian"), transformer)
    transformer.enable_gradient_checkpointing()
    transformer.train()
    gen = torch.Generator().manual_seed(0)
    noisy = torch.randn(2, 16, 8, 8, generator=gen)
    text = [torch.randn(5, 32, generator=gen), torch.randn(9, 32, generator=gen)]

    def step():
        transformer.zero_grad(set_to_none=True)
        frames = list(noisy.unsqueeze(2).unbind(0))
        out = transformer(frames, torch.tensor([0.3, 0.7]), text, return_dict=False)[0]
        loss = torch.stack(out).float().pow(2).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in transformer.named_parameters()
                               if p.grad is not None}

    want_loss, want_grads = step()
    units = swap_units(transformer)
    assert units == list(transformer.layers)
    moves: list[tuple[int, str]] = []
    swapper = BlockSwapper(units, 1, torch.device("cpu"), lambda i, d: moves.append((i, d)))
    loss, grads = step()
    seen = list(moves)
    swapper.remove()  # brings every unit back to the device
    assert torch.equal(loss, want_loss) and grads.keys() == want_grads.keys() and grads
    assert all(torch.equal(grads[k], want_grads[k]) for k in grads)
    assert seen == [(1, "in"), (1, "out"), (1, "in"), (1, "out")], seen
