"""FLUX.2's last single-stream block without the text rows that the transformer drops
(trainer/families/flux2/last_block.py): diffusers' outputs and gradients to float rounding,
fewer matrix products, diffusers' own forward for every call that is not the plain one, and
installed by the family's call."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import Flux2KleinPipeline as Pipe
from peft import LoraConfig
from torch.utils.flop_counter import FlopCounterMode

from trainer.config import ModelSection
from trainer.families import family
from trainer.families.flux2 import last_block
from trainer.families.flux2.last_block import live_rows_only
from trainer.families.flux2.tiny import _transformer
from trainer.methods.fast_lora import lean_forward
from trainer.models.loader import load_base_model

pytestmark = pytest.mark.usefixtures("no_network")

# the studio's FLUX.2 targets (trainer/families/flux2/lora.py) as one peft pattern
TARGETS = (r".*(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out|linear_in"
           r"|linear_out|to_qkv_mlp_proj|single_transformer_blocks\.\d+\.attn\.to_out)$")
TEXT = 10  # text tokens; the image is 4 x 6 = 24 tokens


def adapted(seed: int = 0):
    """The tiny twin's transformer with a rank-4 LoRA whose up projections are not zero."""
    torch.manual_seed(seed)
    model = _transformer().requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=2, init_lora_weights="gaussian",
                                 target_modules=TARGETS))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    lean_forward(model)
    return model


def inputs():
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 32, 4, 6, generator=g)
    return latents, torch.randn(1, TEXT, 96, generator=g)


def call(model, latents, text, **kwargs):
    tokens = Pipe._pack_latents(latents).requires_grad_(True)
    out = model(hidden_states=tokens, timestep=torch.tensor([0.6]), guidance=None,
                encoder_hidden_states=text, txt_ids=Pipe._prepare_text_ids(text),
                img_ids=Pipe._prepare_latent_ids(latents), return_dict=False, **kwargs)[0]
    return tokens, out


def step(model, **kwargs):
    """The output, the latents' gradient and every trained parameter's gradient."""
    for p in model.parameters():
        p.grad = None
    tokens, out = call(model, *inputs(), **kwargs)
    out.pow(2).mean().backward()
    return [out.detach(), tokens.grad] + [p.grad for p in model.parameters() if p.requires_grad]


def close(got, expected):
    return len(got) == len(expected) and all(
        torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, expected))


def forward_flops(model, **kwargs) -> int:
    with FlopCounterMode(display=False) as counter:
        call(model, *inputs(), **kwargs)
    return counter.get_total_flops()


def test_the_image_rows_are_diffusers_and_the_text_rows_cost_keys_and_values_only():
    lean, plain = adapted(), adapted()
    assert live_rows_only(lean) and not live_rows_only(lean)  # once
    got, expected = step(lean), step(plain)
    assert close(got, expected)
    assert len(got) > 2 and all(g.abs().sum() > 0 for g in got[1:])
    assert lean.single_transformer_blocks[-1]._text_rows == TEXT
    # saved per text row, at the least: the fused input projection's query and MLP columns
    # and the output projection (the LoRA products and the queries' attention come on top)
    attn = plain.single_transformer_blocks[-1].attn
    inner, mlp, dim = attn.inner_dim, attn.mlp_hidden_dim, attn.query_dim
    least = 2 * TEXT * dim * (inner + 2 * mlp) + 2 * TEXT * (inner + mlp) * dim
    assert forward_flops(plain) - forward_flops(lean) >= least


def test_with_gradient_checkpointing_too():
    lean, plain = adapted(), adapted()
    live_rows_only(lean)
    for model in (lean, plain):
        model.enable_gradient_checkpointing()
        model.train()
    assert close(step(lean), step(plain))


def test_a_call_that_is_not_the_plain_one_runs_diffusers_forward():
    lean, plain = adapted(), adapted()
    live_rows_only(lean)
    extra = {"joint_attention_kwargs": {"scale": 1.0}}
    got, expected = step(lean, **extra), step(plain, **extra)
    assert all(map(torch.equal, got, expected))
    assert lean.single_transformer_blocks[-1]._text_rows is None
    assert forward_flops(lean, **extra) == forward_flops(plain, **extra)
    # the next plain call skips the dead rows again
    assert forward_flops(lean) < forward_flops(plain)


def test_a_hooked_projection_is_computed_whole_with_the_same_result():
    """fp8 storage computes a Linear from a copy in a pre-hook (trainer/models/memory.py): the
    text rows' keys and values then come from the whole layer, sliced."""
    lean, plain = adapted(), adapted()
    live_rows_only(lean)
    calls = []
    base = lean.single_transformer_blocks[-1].attn.to_qkv_mlp_proj.base_layer
    base.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[1]))
    assert close(step(lean), step(plain))
    assert calls == [24, TEXT]  # the image rows, then the text rows whole


def test_the_family_call_installs_it():
    model = load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-flux2"))
    plain = copy.deepcopy(model.denoiser)
    last = model.denoiser.single_transformer_blocks[-1]
    assert getattr(last.forward, "__func__", None) is not last_block._forward
    g = torch.Generator().manual_seed(1)
    noisy = torch.randn(1, model.vae.config.latent_channels, 8, 8, generator=g)
    with torch.no_grad():
        text = family("flux2").encode(model, ["a red circle"], clip_skip=1)
        got = family("flux2").predict(model, noisy, torch.tensor([0.6]), text, None)
    assert last.forward.__func__ is last_block._forward
    assert last._text_rows == text.hidden.shape[1]
    with torch.no_grad():  # diffusers' forward on the same inputs, as the pipeline calls it
        model.denoiser = plain
        plain._lean_swiglu = True  # keeps diffusers' forward: the family call installs once
        expected = family("flux2").predict(model, noisy, torch.tensor([0.6]), text, None)
    assert getattr(plain.single_transformer_blocks[-1].forward, "__func__", None) \
        is not last_block._forward
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_lycoris_network_on_the_projection_counts_for_the_text_rows_too():
    """LyCORIS (here LoKr on every Linear of the blocks) replaces the layers' forward: the text
    rows' keys and values are computed through it, as diffusers' block computes them."""
    from lycoris import create_lycoris

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _transformer().requires_grad_(False)
        torch.manual_seed(1)
        network = create_lycoris(model, 1.0, linear_dim=4, linear_alpha=2, algo="lokr")
        network.apply_to()
        for p in network.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(3))
        models.append((model, network))
    (lean, lean_net), (plain, plain_net) = models
    live_rows_only(lean)

    def lycoris_step(model, network):
        out = step(model)
        return out[:2] + [p.grad for p in network.parameters() if p.requires_grad]

    got, expected = lycoris_step(lean, lean_net), lycoris_step(plain, plain_net)
    assert close(got, expected) and len(got) > 2
    assert all(g is not None for g in got[2:])
