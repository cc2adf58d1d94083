"""The lean forward of peft's LoRA layers: the same numbers bit for bit, peft's own forward in
every other state."""

import pytest
import torch
from peft import LoraConfig

from trainer.config import ModelSection, TrainConfig
from trainer.methods.fast_lora import lean_forward
from trainer.methods.lora import UNET_CONV_TARGETS, UNET_TARGETS, LoraMethod


@pytest.fixture
def model():
    from trainer.models.loader import load_base_model

    torch.manual_seed(0)
    return load_base_model(ModelSection())


def inputs(model):
    g = torch.Generator().manual_seed(1)
    hidden = model.text_encoder.config.hidden_size
    return (torch.randn(1, 4, 8, 8, generator=g), torch.tensor([500]),
            torch.randn(1, 77, hidden, generator=g))


def output_and_grads(unet, x, t, h):
    for p in unet.parameters():
        p.grad = None
    out = unet(x, t, h).sample
    out.pow(2).mean().backward()
    return out.detach(), [p.grad.clone() for p in unet.parameters() if p.grad is not None]


def adapted(unet, dropout=0.0, alpha=2):
    unet.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=alpha, lora_dropout=dropout,
                                init_lora_weights="gaussian",
                                target_modules=UNET_TARGETS + UNET_CONV_TARGETS))
    for name, p in unet.named_parameters():
        if "lora_B" in name:  # peft starts B at zero; a non-zero update tests the maths
            torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(2))
    return unet


def autograd_nodes(out, name):
    """How many nodes of ``out``'s backward graph are called ``name``."""
    seen, todo, count = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == name
        todo.extend(fn for fn, _ in node.next_functions)
    return count


@pytest.mark.parametrize("alpha", [2, 4])  # scale 0.5, and 1 (alpha == rank)
def test_same_outputs_and_gradients_bit_for_bit(model, alpha):
    unet = adapted(model.unet, alpha=alpha)
    args = inputs(model)
    out, grads = output_and_grads(unet, *args)
    layers = sum(1 for m in unet.modules() if hasattr(m, "lora_A"))
    assert lean_forward(unet) == layers > 0
    lean_out, lean_grads = output_and_grads(unet, *args)
    assert torch.equal(out, lean_out)
    assert len(grads) == len(lean_grads) and all(map(torch.equal, grads, lean_grads))


def test_a_scale_of_one_costs_no_product(model):
    unet = adapted(model.unet, alpha=4)
    x, t, h = inputs(model)
    muls = autograd_nodes(unet(x, t, h).sample, "MulBackward0")
    layers = lean_forward(unet)
    assert autograd_nodes(unet(x, t, h).sample, "MulBackward0") == muls - layers


def test_disabled_adapters_go_through_peft(model):
    args = inputs(model)
    with torch.no_grad():
        base = model.unet(*args).sample
    unet = adapted(model.unet)
    lean_forward(unet)
    unet.disable_adapters()
    with torch.no_grad():
        assert torch.equal(unet(*args).sample, base)
    unet.enable_adapters()
    with torch.no_grad():
        assert not torch.equal(unet(*args).sample, base)


def test_layers_with_dropout_keep_peft_forward(model):
    unet = adapted(model.unet, dropout=0.1)
    assert lean_forward(unet) == 0


def test_the_lora_method_uses_it(model):
    cfg = TrainConfig()
    cfg.network.train_text_encoder = True
    LoraMethod(cfg).prepare(model)
    for network in (model.unet, model.text_encoder):
        layers = [m for m in network.modules() if hasattr(m, "lora_A")]
        assert layers and all(hasattr(m, "_lean") for m in layers)
