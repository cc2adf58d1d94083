"""An fp32 run keeps the frozen weights of a bf16 / fp16 checkpoint in that dtype
(trainer/models/narrow_storage.py): the same numbers, half the bytes, and autograd keeps the
stored weight, not an fp32 copy."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log
from trainer.models import narrow_storage
from trainer.models.narrow_storage import narrowest, store_narrow
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")


def saved_bytes(fn):
    """What autograd saves for the backward pass while ``fn`` runs, in bytes."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_narrow_linear_computes_what_the_fp32_layer_computes(dtype):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96)
    linear.weight.data = linear.weight.data.to(dtype).float()  # a checkpoint's values
    linear.requires_grad_(False)
    x = torch.randn(2, 7, 64, requires_grad=True)
    wide, wide_saved = saved_bytes(lambda: linear(x))
    (grad_wide,) = torch.autograd.grad(wide.square().sum(), x)
    assert narrowest(linear.weight.data) == dtype
    stored = torch.nn.Linear(64, 96)
    stored.load_state_dict(linear.state_dict())
    stored.requires_grad_(False)
    assert store_narrow(torch.nn.Sequential(stored)) == (1, 64 * 96 * 2)
    assert stored.weight.dtype == dtype
    narrow, narrow_saved = saved_bytes(lambda: stored(x))
    (grad_narrow,) = torch.autograd.grad(narrow.square().sum(), x)
    assert torch.equal(narrow, wide) and torch.equal(grad_narrow, grad_wide)
    # the fp32 layer saves its fp32 weight for the input's gradient, this one the stored one
    assert wide_saved == 64 * 96 * 4 and narrow_saved == 64 * 96 * 2


def test_weights_that_are_not_narrow_values_stay_fp32():
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    layers.requires_grad_(False)
    layers[1].weight.requires_grad_(True)  # a trained layer is never narrowed
    layers[1].weight.data = layers[1].weight.data.to(torch.bfloat16).float()
    assert narrowest(layers[0].weight.data) is None  # random fp32 values
    assert store_narrow(layers) == (0, 0)
    assert layers[0].weight.dtype == layers[1].weight.dtype == torch.float32
    # a layer whose forward something replaced (LyCORIS wraps a layer so) is left alone
    wrapped = torch.nn.Linear(8, 8).requires_grad_(False)
    wrapped.weight.data = wrapped.weight.data.to(torch.bfloat16).float()
    wrapped.forward = lambda x: x
    assert store_narrow(torch.nn.Sequential(wrapped)) == (0, 0)


def test_an_fp32_lora_run_from_a_bf16_folder_keeps_its_weights_in_bf16(tmp_path, monkeypatch):
    """The tiny Z-Image with its transformer saved in bf16, as the released folders are: the
    fp32 run stores its frozen layers in bf16 and trains the LoRA it trains with them
    widened (the same file, to fp32 rounding of the backward's matmul)."""
    from diffusers import ZImageTransformer2DModel

    from trainer.families.zimage.tiny import save_tiny_zimage

    folder = save_tiny_zimage(tmp_path / "zimage")
    transformer = ZImageTransformer2DModel.from_pretrained(folder / "transformer")
    transformer.to(torch.bfloat16).save_pretrained(folder / "transformer")
    data = one_image_dataset(tmp_path / "data")

    def train(name):
        cfg = small_config(tmp_path / name, data,
                           model={"pretrained_model_name_or_path": str(folder)},
                           training={"max_train_steps": 3, "mixed_precision": "no"})
        sink = ListSink()
        result = run(cfg, sink)
        assert result.status == "finished", result.error
        return load_file(result.output_path), [e.message for e in sink.of(Log)]

    narrow, logs = train("narrow")
    line = next(m for m in logs if m.startswith("Base weights:"))
    assert "frozen Linear layers of the denoiser hold bf16 / fp16 values" in line
    monkeypatch.setattr(narrow_storage, "store_narrow", lambda module: (0, 0))
    wide, logs = train("wide")
    assert not any(m.startswith("Base weights:") for m in logs)
    assert narrow.keys() == wide.keys()
    for key, tensor in narrow.items():
        torch.testing.assert_close(tensor, wide[key], rtol=1e-5, atol=1e-7)
