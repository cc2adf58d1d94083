"""Max-norm (scale_weight_norms) and sd-scripts' rank / module dropout on peft's LoRA
(issue 21); the expected values are computed here from the matrices."""

import math

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from tests.train_helpers import one_image_dataset, small_config
from trainer.methods.lora_regularize import add_dropout, apply_max_norm
from trainer.run.loop import run


def _net(rank=4, alpha=2.0):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Conv2d(3, 6, 3))
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=["0", "1"],
                                       init_lora_weights="gaussian"), model)
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(p, std=3.0)
    return model


def test_max_norm_scales_each_update_to_the_limit():
    model = _net()
    lin, conv = model[0], model[1]
    before = (lin.lora_B["default"].weight @ lin.lora_A["default"].weight) * 0.5
    scaled, mean, top = apply_max_norm([model], 1.0)
    after = (lin.lora_B["default"].weight @ lin.lora_A["default"].weight) * 0.5
    assert before.norm() > 1 and scaled == 2
    assert after.norm().item() == pytest.approx(1.0, rel=1e-4)
    torch.testing.assert_close(after, before / before.norm())  # the direction is kept
    a, b = conv.lora_A["default"].weight, conv.lora_B["default"].weight  # 3x3 down, 1x1 up
    w = torch.einsum("or,rikl->oikl", b[:, :, 0, 0], a) * 0.5
    assert w.norm().item() == pytest.approx(1.0, rel=1e-4)
    assert top == pytest.approx(1.0, rel=1e-4) and mean == pytest.approx(1.0, rel=1e-4)
    assert apply_max_norm([model], 1.0)[0] == 0  # at the limit: nothing more to scale


def test_rank_dropout_masks_ranks_and_rescales():
    model = _net(rank=64, alpha=64.0)
    add_dropout([model], rank=0.5, module=None)
    lin = model[0]
    x = torch.randn(2, 5, 8)
    base = lin.base_layer(x)
    full = lin.lora_B["default"](lin.lora_A["default"](x))
    torch.manual_seed(3)
    out = lin(x) - base
    # each sample keeps the same ranks at every position; kept ranks count double
    torch.manual_seed(3)
    mask = (torch.rand(2, 64) > 0.5).float()
    want = lin.lora_B["default"](lin.lora_A["default"](x) * mask[:, None, :]) * 2.0
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(out, full)
    lin.eval()
    torch.testing.assert_close(lin(x) - base, full, atol=1e-5, rtol=1e-5)  # not when evaluating


def test_module_dropout_skips_the_whole_update():
    model = _net()
    add_dropout([model], rank=None, module=0.999999)
    x = torch.randn(3, 8)
    torch.testing.assert_close(model[0](x), model[0].base_layer(x))


def test_two_steps_with_max_norm_and_dropout(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, network={"scale_weight_norms": 1e-6, "rank_dropout": 0.3,
                                                "module_dropout": 0.1, "conv_dim": 2},
                       training={"max_train_steps": 2})
    logs = []

    class Sink:
        def emit(self, event):
            logs.append(getattr(event, "message", ""))

    result = run(cfg, Sink())
    assert result.status == "finished", result.error
    assert any(m.startswith("max-norm:") and "modules scaled" in m for m in logs)
    from safetensors.torch import load_file

    tensors = load_file(result.output_path)
    for key in [k for k in tensors if k.endswith(".lora_down.weight")][:20]:
        name = key.split(".")[0]
        down, up = tensors[key].float(), tensors[name + ".lora_up.weight"].float()
        scale = tensors[name + ".alpha"].float() / down.shape[0]
        if down.dim() == 4 and down.shape[2:] != (1, 1):
            w = torch.nn.functional.conv2d(down.permute(1, 0, 2, 3), up).permute(1, 0, 2, 3)
        else:
            w = up.flatten(1) @ down.flatten(1)
        assert (w * scale).norm().item() <= 1e-6 * (1 + 1e-2) or math.isclose(
            (w * scale).norm().item(), 0, abs_tol=1e-6)
