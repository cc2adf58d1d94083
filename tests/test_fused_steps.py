"""optimizer.fused_backward_pass / fused_optimizer_groups (sd-scripts' sdxl_train.py): the
optimizer steps in the backward pass, each parameter (or group) as soon as its gradient is in,
and frees the gradient: the same weights as the normal step, fewer gradients alive."""

from __future__ import annotations

import math

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from train_helpers import one_image_dataset, small_config

from trainer.config import TrainConfig
from trainer.methods.dreambooth import DreamBoothMethod
from trainer.run import fused_steps
from trainer.run.failures import NonFiniteError
from trainer.run.fused_steps import FusedSteps, chunks_of
from trainer.run.loop import run


def trained_weights(tmp_path, monkeypatch, alive=None, **optimizer):
    """A 2-step SD 1.x DreamBooth run (UNet and text encoder at two rates); the weights at the
    save, and in ``alive`` the trained parameters holding a gradient at each fused step."""
    weights = {}
    real_save = DreamBoothMethod.save

    def save(self, path, model, facts, final=True):
        for name in ("unet", "text_encoder"):
            for key, p in getattr(model, name).named_parameters():
                weights[f"{name}.{key}"] = p.detach().clone()
        return real_save(self, path, model, facts, final)

    monkeypatch.setattr(DreamBoothMethod, "save", save)
    if alive is not None:
        real_step = FusedSteps._step_chunk

        def step_chunk(self, i):
            params = [p for chunk in self.chunks for p in chunk]
            alive.append((sum(p.grad is not None for p in params), len(params)))
            return real_step(self, i)

        monkeypatch.setattr(FusedSteps, "_step_chunk", step_chunk)
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    cfg = small_config(
        tmp_path / optimizer.get("optimizer_type", "x"), data, mode="dreambooth",
        training={"max_train_steps": 2, "mixed_precision": "no"},
        network={"train_text_encoder": True},
        optimizer={"learning_rate": 1e-3, "text_encoder_lr": 5e-4, "max_grad_norm": 0.0,
                   **optimizer})
    result = run(cfg)
    assert result.status == "finished", result.error
    monkeypatch.undo()
    return weights


@pytest.mark.parametrize("opt", [
    {"optimizer_type": "AdamW", "weight_decay": 0.01},
    {"optimizer_type": "Adafactor", "optimizer_args": {"relative_step": False}},
])
def test_fused_steps_train_the_same_weights_as_the_normal_step(
        tmp_path, monkeypatch, one_torch_thread, opt):  # noqa: F811
    normal = trained_weights(tmp_path / "normal", monkeypatch, **opt)
    alive = []
    fused = trained_weights(tmp_path / "fused", monkeypatch, alive,
                            fused_backward_pass=True, **opt)
    grouped_alive = []
    grouped = trained_weights(tmp_path / "grouped", monkeypatch, grouped_alive,
                              fused_optimizer_groups=3, **opt)
    base = trained_weights(tmp_path / "base", monkeypatch, learning_rate=1e-9,
                           text_encoder_lr=1e-9, **{k: v for k, v in opt.items()
                                                    if k == "optimizer_type"})
    assert set(fused) == set(normal) == set(grouped)
    moved = [k for k in normal if not torch.allclose(normal[k], base[k], atol=1e-6)]
    assert len(moved) > len(normal) // 2  # the run trained most of the model
    for key in normal:
        torch.testing.assert_close(fused[key], normal[key], rtol=1e-5, atol=1e-6, msg=key)
        torch.testing.assert_close(grouped[key], normal[key], rtol=1e-5, atol=1e-6, msg=key)
    # the normal step holds every trained parameter's gradient at once; one at a time here
    total = alive[0][1]
    assert total > 100 and max(n for n, _ in alive) == 1
    assert len(alive) >= 2 * total - 20  # nearly every parameter stepped in its hook
    assert 1 < max(n for n, _ in grouped_alive) < total


def test_chunks_are_cut_as_sd_scripts_cuts_them_and_at_a_rate_change():
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(8)]
    groups = [{"params": params[:5], "lr": 1.0}, {"params": params[5:], "lr": 2.0}]
    sizes = [len(c) for c in chunks_of(groups, 3)]  # ceil(8 / 3) = 3 per chunk
    assert sizes == [3, 2, 3]
    assert [len(c) for c in chunks_of(groups, None)] == [1] * 8
    params[0].requires_grad_(False)  # a frozen parameter is not stepped
    assert sum(len(c) for c in chunks_of(groups, None)) == 7


def _linear_run(max_norm, scale=1.0, groups=None):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    fused = FusedSteps(opt, chunks_of(opt.param_groups, groups), max_norm)
    before = [p.detach().clone() for p in layer.parameters()]
    x = torch.randn(5, 4)
    loss = (layer(x) * scale).square().sum()
    grads = torch.autograd.grad(loss, list(layer.parameters()), retain_graph=True)
    loss.backward()
    fused.step()
    return layer, before, grads, fused


def test_max_grad_norm_clips_each_parameter_on_its_own_as_sd_scripts_hook_does():
    layer, before, grads, _ = _linear_run(max_norm=0.5, scale=10.0)
    for p, p0, g in zip(layer.parameters(), before, grads):
        norm = g.norm()
        assert norm > 0.5  # each gradient was over the bound
        expected = p0 - 0.1 * g * (0.5 / (norm + 1e-6))
        torch.testing.assert_close(p.detach(), expected)
        assert p.grad is None  # freed in the hook
    unclipped, before, grads, _ = _linear_run(max_norm=0.0, scale=10.0)
    for p, p0, g in zip(unclipped.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g)


def test_a_non_finite_gradient_stops_the_run_with_the_reason():
    layer, _, _, fused = _linear_run(max_norm=0.0, groups=1)
    (layer(torch.ones(1, 4)) * math.inf).sum().backward()  # infinite gradients
    with pytest.raises(NonFiniteError, match="not finite.*fused backward pass"):
        fused.step()


def test_a_chunk_with_a_parameter_without_gradient_is_stepped_by_step():
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([*used.parameters(), *unused.parameters()], lr=0.1)
    fused = FusedSteps(opt, chunks_of(opt.param_groups, 1), 0.0)  # one chunk of four
    w0 = used.weight.detach().clone()
    used(torch.ones(1, 2)).sum().backward()
    assert torch.equal(used.weight, w0) and used.weight.grad is not None  # the chunk waits
    fused.step()
    assert not torch.equal(used.weight, w0) and used.weight.grad is None


@pytest.mark.parametrize("settings, match", [
    ({"training": {"gradient_accumulation_steps": 2}},
     r"optimizer.fused_backward_pass .*gradient_accumulation_steps = 1"),
    ({"optimizer": {"optimizer_type": "Prodigy"}},
     r"optimizer.fused_backward_pass .*'Prodigy' cannot"),
    ({"optimizer": {"optimizer_type": "AdamWScheduleFree"}}, r"'AdamWScheduleFree' cannot"),
    ({"optimizer": {"optimizer_class": "came_pytorch.CAME"}}, r"'came_pytorch.CAME' cannot"),
    ({"training": {"mixed_precision": "fp16"}}, r"fp16's loss scaler"),
    ({"training": {"num_processes": 2}}, r"num_processes = 2"),
    ({"mode": "lora"}, r"is for DreamBooth"),
    ({"optimizer": {"fused_optimizer_groups": 4}}, r"keep one"),
])
def test_refused_at_load_where_it_cannot_run(settings, match):
    data = {"mode": settings.get("mode", "dreambooth"),
            "optimizer": {"fused_backward_pass": True, **settings.get("optimizer", {})},
            "training": settings.get("training", {})}
    with pytest.raises(ValueError, match=match):
        TrainConfig(**data)
    groups = {**data, "optimizer": {**data["optimizer"], "fused_backward_pass": False,
                                    "fused_optimizer_groups": 4}}
    if "keep one" not in match:  # the same refusals name the groups' field
        with pytest.raises(ValueError, match="optimizer.fused_optimizer_groups"):
            TrainConfig(**groups)


def test_fp16_resolved_on_the_device_is_refused_when_the_run_starts():
    cfg = TrainConfig(mode="dreambooth", optimizer={"fused_backward_pass": True})

    class Session:
        pass

    s = Session()
    s.cfg, s.precision = cfg, "fp16"
    s.accelerator = type("Acc", (), {"num_processes": 1})()
    with pytest.raises(fused_steps.FusedUnavailable, match="resolved to fp16"):
        fused_steps.install(s)
