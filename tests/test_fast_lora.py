"""The lean forward of peft's LoRA layers: peft's numbers (bit for bit where it keeps peft's
operations, within float rounding where a frozen Linear runs as one fused function), peft's own
forward in every other state."""

import pytest
import torch
from peft import LoraConfig
from torch.utils.flop_counter import FlopCounterMode

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


def close(a, b):
    """Equal within float32 rounding: the relative error of the whole tensor."""
    return a.shape == b.shape and ((a - b).norm() <= 1e-5 * b.norm()).item()


@pytest.mark.parametrize("alpha", [2, 4])  # scale 0.5, and 1 (alpha == rank)
def test_same_outputs_and_gradients_as_peft(model, alpha):
    unet = adapted(model.unet, alpha=alpha)
    args = inputs(model)
    out, grads = output_and_grads(unet, *args)
    layers = sum(1 for m in unet.modules() if hasattr(m, "lora_A"))
    assert lean_forward(unet) == layers > 0
    lean_out, lean_grads = output_and_grads(unet, *args)
    assert close(lean_out, out)
    assert len(grads) == len(lean_grads) and all(map(close, lean_grads, grads))


@pytest.mark.parametrize("alpha", [2, 4])
def test_convolutions_keep_peft_operations_bit_for_bit(model, alpha):
    """A LoRA on a Conv2d still runs peft's operations: the same numbers exactly."""
    unet = adapted(model.unet, alpha=alpha)
    conv = unet.down_blocks[0].resnets[0].conv1
    x = torch.randn(1, conv.base_layer.in_channels, 8, 8,
                    generator=torch.Generator().manual_seed(3), requires_grad=True)

    def run():
        x.grad = conv.lora_A["default"].weight.grad = conv.lora_B["default"].weight.grad = None
        out = conv(x)
        out.pow(2).sum().backward()
        return [out.detach(), x.grad, conv.lora_A["default"].weight.grad,
                conv.lora_B["default"].weight.grad]

    before = run()
    lean_forward(unet)
    assert all(map(torch.equal, run(), before))


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


class Block(torch.nn.Module):
    def __init__(self, features=24, out=40, bias=True, dtype=torch.float32):
        super().__init__()
        self.proj = torch.nn.Linear(features, out, bias=bias, dtype=dtype)


def lora_block(alpha=2, bias=True, dtype=torch.float32, seed=0):
    from peft import inject_adapter_in_model

    torch.manual_seed(seed)
    block = Block(bias=bias, dtype=dtype).requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=alpha, target_modules=["proj"]), block)
    torch.nn.init.normal_(block.proj.lora_B["default"].weight, std=0.1)
    return block


def run_block(block, x):
    layer = block.proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    a.grad = b.grad = None
    x = x.detach().clone().requires_grad_(True)
    out = block.proj(x)
    (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return out.detach(), x.grad, a.grad, b.grad


@pytest.mark.parametrize("alpha", [2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_a_frozen_linear_runs_as_one_function_with_peft_numbers(alpha, bias):
    from trainer.methods.fast_lora import LoraLinear

    block = lora_block(alpha, bias)
    x = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(1))
    expected = run_block(block, x)
    lean_forward(block)
    assert type(block.proj(x).grad_fn).__name__ == "LoraLinearBackward"
    assert LoraLinear is not None
    got = run_block(block, x)
    assert all(map(close, got, expected))
    # a transposed (non-contiguous) input and one that needs no gradient
    xt = torch.randn(2, 24, 6, generator=torch.Generator().manual_seed(2)).transpose(1, 2)
    assert not xt.is_contiguous()
    assert close(block.proj(xt), lora_block(alpha, bias).proj(xt))
    with torch.no_grad():
        assert close(block.proj(x), expected[0])


def test_the_function_passes_gradcheck():
    from trainer.methods.fast_lora import LoraLinear

    g = torch.Generator().manual_seed(0)
    d = dict(dtype=torch.float64)
    x = torch.randn(2, 3, 5, generator=g, **d).requires_grad_(True)
    w, bias = torch.randn(7, 5, generator=g, **d), torch.randn(7, generator=g, **d)
    a = torch.randn(4, 5, generator=g, **d).requires_grad_(True)
    b = torch.randn(7, 4, generator=g, **d).requires_grad_(True)
    for scale in (1.0, 0.5):
        assert torch.autograd.gradcheck(
            lambda x, a, b, s=scale: LoraLinear.apply(x, w, bias, a, b, s, torch.float64),
            (x, a, b))
    assert torch.autograd.gradcheck(  # the input needs no gradient: none is computed
        lambda a, b: LoraLinear.apply(x.detach(), w, None, a, b, 0.5, torch.float64), (a, b))


def new_tensors(block, x, numel):
    """How many tensors of ``numel`` elements the forward and the backward of ``block.proj``
    allocate (in-place operations allocate none)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {"forward": 0, "backward": 0}

    class Count(TorchDispatchMode):
        phase = "forward"

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if isinstance(out, torch.Tensor) and out.numel() == numel \
                    and not name.endswith("_") and name not in ("view", "t", "transpose",
                                                                "_unsafe_view", "reshape",
                                                                "detach", "alias"):
                counts[self.phase] += 1
            return out

    x = x.detach().clone().requires_grad_(True)
    grad = torch.ones(*x.shape[:-1], block.proj.base_layer.out_features)
    with Count() as mode:
        out = block.proj(x)
        mode.phase = "backward"
        out.backward(grad)
    return counts


def test_the_update_is_accumulated_in_place():
    """peft writes the update and then the sum as tensors of the output's size, and adds the
    update's input gradient as another; the lean function writes one output and one input
    gradient."""
    x = torch.randn(1, 64, 24, generator=torch.Generator().manual_seed(1))
    block = lora_block(alpha=2, bias=False)
    peft_out = new_tensors(block, x, 64 * 40)
    peft_dx = new_tensors(block, x, 64 * 24)
    lean_forward(block)
    lean_out = new_tensors(block, x, 64 * 40)
    lean_dx = new_tensors(block, x, 64 * 24)
    assert lean_out["forward"] == 1 and peft_out["forward"] >= 3
    assert lean_dx["backward"] == 1 and peft_dx["backward"] >= 2


def test_autocast_computes_in_its_dtype_and_trains_fp32_weights():
    """bf16 autocast on the CPU (a CPU run's mixed precision, trainer/run/cpu_precision.py):
    the output is bf16 as peft's, the adapter's gradients fp32 and close to peft's."""
    x = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(1))
    block = lora_block(alpha=2, dtype=torch.bfloat16)
    for name, p in block.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = run_block(block, x)
        lean_forward(block)
        got = run_block(block, x)
        assert type(block.proj(x).grad_fn).__name__ == "LoraLinearBackward"
    assert got[0].dtype == expected[0].dtype == torch.bfloat16
    assert got[2].dtype == got[3].dtype == torch.float32
    for g, e in zip(got, expected):
        assert torch.allclose(g.float(), e.float(), rtol=2e-2, atol=2e-2 * e.abs().max().item())


def test_mixed_dtypes_without_autocast_and_the_meta_device_keep_peft_operations():
    """A bf16 base under an fp32 adapter with no autocast: peft's casts, bit for bit; on the
    meta device (the advisor's simulated step) peft's operations, which its laws measured."""
    x = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(1)).bfloat16()
    block = lora_block(alpha=2, dtype=torch.bfloat16)
    for name, p in block.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    expected = run_block(block, x)
    lean_forward(block)
    assert all(map(torch.equal, run_block(block, x), expected))
    meta = lora_block(alpha=2).to("meta")
    lean_forward(meta)
    out = meta.proj(torch.zeros(2, 24, device="meta", requires_grad=True))
    assert type(out.grad_fn).__name__ == "AddBackward0"


def ops_of(fn) -> list[str]:
    """The aten operators that ``fn()`` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


def test_a_slice_of_a_sequence_runs_as_one_matrix_product():
    """``x[:, n:]`` of one sequence (the text or image rows of a joint block) is a plain
    matrix product, not a batched one over an expanded weight (slower on the CPU)."""
    block = lora_block(alpha=2)
    lean_forward(block)
    x = torch.randn(1, 10, 24, generator=torch.Generator().manual_seed(1))[:, 3:]
    ops = ops_of(lambda: block.proj(x))
    assert "bmm" not in ops and "mm" in ops or "addmm" in ops


@pytest.mark.parametrize("bias", [True, False])
def test_some_output_columns_of_a_lean_layer_are_its_whole_output_sliced(bias):
    from trainer.families.common.columns import linear_columns

    block = lora_block(alpha=2, bias=bias)
    lean_forward(block)
    x = torch.randn(2, 6, 24, generator=torch.Generator().manual_seed(1))
    weights = torch.linspace(-1, 1, 40)[10:30]

    def run(fn):
        layer = block.proj
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        a.grad = b.grad = None
        xr = x.detach().clone().requires_grad_(True)
        out = fn(xr)
        (out * weights).sum().backward()
        return out.detach(), xr.grad, a.grad, b.grad

    got = run(lambda xr: linear_columns(block.proj, xr, 10, 30))
    expected = run(lambda xr: block.proj(xr)[..., 10:30])
    assert all(map(close, got, expected))
    assert got[0].shape[-1] == 20 and got[3][:10].abs().sum() == 0 == got[3][30:].abs().sum()
    # only those rows of the weights are multiplied
    ops = ops_of(lambda: linear_columns(block.proj, x, 10, 30))
    assert "bmm" not in ops


def test_columns_of_other_layers():
    """A frozen plain Linear computes those rows of its weight; a trained one, or one with a
    hook, is computed whole and sliced (the same numbers, the same gradients)."""
    from trainer.families.common.columns import linear_columns

    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40).requires_grad_(False)
    x = torch.randn(1, 6, 24)
    assert close(linear_columns(layer, x, 5, 25), layer(x)[..., 5:25])
    flops = []
    for cols in ((5, 25), (0, 40)):
        with FlopCounterMode(display=False) as counter:
            linear_columns(layer, x, *cols)
        flops.append(counter.get_total_flops())
    assert flops == [2 * 6 * 24 * 20, 2 * 6 * 24 * 40]
    layer.requires_grad_(True)
    got = linear_columns(layer, x, 5, 25)
    got.sum().backward()
    grad, layer.weight.grad = layer.weight.grad, None
    layer(x)[..., 5:25].sum().backward()
    assert torch.equal(grad, layer.weight.grad)
    hooked = torch.nn.Linear(24, 40).requires_grad_(False)
    seen = []
    hooked.register_forward_pre_hook(lambda module, args: seen.append(True))
    assert torch.equal(linear_columns(hooked, x, 5, 25), hooked(x)[..., 5:25]) and len(seen) == 2


def test_a_layer_whose_forward_was_replaced_is_computed_whole():
    """LyCORIS puts its adapter in the original Linear's forward (an attribute of the
    instance): the columns then come from that forward, not from the bare weight."""
    from trainer.families.common.columns import linear_columns

    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40).requires_grad_(False)
    extra = torch.randn(40, 24)
    layer.forward = lambda x: torch.nn.functional.linear(x, layer.weight + extra, layer.bias)
    x = torch.randn(1, 6, 24)
    assert torch.equal(linear_columns(layer, x, 5, 25), layer(x)[..., 5:25])
