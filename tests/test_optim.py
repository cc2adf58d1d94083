"""The optimizers and schedules of sd-scripts' configs: each trains, the learning rate reported is
the one applied, schedule-free runs save their averaged weights, and what cannot work is refused
with the setting named."""

from __future__ import annotations

import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.config import OptimizerName
from trainer.events import Control, ListSink, Log, NullSink, Step
from trainer.optim.lr import averaged_weights, effective_lr, lr_notes
from trainer.optim.optimizers import OPTIMIZERS, OptimizerError, make_optimizer, make_scheduler
from trainer.run.loop import run


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, studio_home):
    """A LoRA session on the tiny model, its first batch and its trained weights as built."""
    from trainer.run.reporter import Reporter
    from trainer.run.session import Session, prepare

    tmp = tmp_path_factory.mktemp("optim")
    cfg = small_config(tmp, one_image_dataset(tmp / "data"))
    s = Session(cfg)
    prepare(s, Reporter(NullSink(), Control()))
    batch = next(iter(s.data.epoch(1, 1, cfg.training.seed)))
    groups = [{"params": g["params"], "lr": g["lr"]} for g in s.optimizer.param_groups]
    start = [p.detach().clone() for g in groups for p in g["params"]]
    yield s, batch, groups, start
    s.release()


def section(name: str, **values):
    base = {"optimizer_type": name, "learning_rate": 1e-3, **values}
    return small_config(Path("/tmp/unused"), Path("/tmp/unused"), optimizer=base).optimizer


def test_every_schema_name_has_a_builder():
    assert set(typing.get_args(OptimizerName)) == set(OPTIMIZERS)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizer_takes_two_steps_on_the_tiny_model(prepared, name):
    from trainer.run.step import batch_loss

    s, batch, groups, start = prepared
    params = [p for g in groups for p in g["params"]]
    with torch.no_grad():
        for p, p0 in zip(params, start):
            p.copy_(p0)
    sched = "adafactor" if name == "Adafactor" else "constant"  # Adafactor's relative step
    opt_section = section(name, lr_scheduler=sched)
    optimizer = make_optimizer(opt_section, groups, "cpu")
    scheduler = make_scheduler(opt_section, optimizer, 2)
    torch.manual_seed(0)
    # RAdam's rectification leaves the first 4 steps without an update (Liu et al. 2020)
    for _ in range(5 if name == "RAdamScheduleFree" else 2):
        loss = batch_loss(batch, s.model, s.cfg, torch.device("cpu"), torch.float32)
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    assert all(torch.isfinite(p).all() for p in params)
    assert any(not torch.equal(p, p0) for p, p0 in zip(params, start)), "nothing trained"
    assert effective_lr(optimizer, scheduler) > 0


def train(tmp_path: Path, steps: int = 2, **optimizer) -> tuple[ListSink, object]:
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"), optimizer=optimizer,
                       training={"max_train_steps": steps}, saving={"save_state": True})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return sink, result


def test_adafactor_relative_step_reports_its_own_step_size(tmp_path):
    # warmup_init without scale_parameter: step t uses min(1e-6 t, 1/sqrt(t)) (Shazeer & Stern
    # 2018, sec. 8; transformers' Adafactor._get_lr), whatever learning_rate says
    sink, _ = train(tmp_path, lr_scheduler="adafactor", learning_rate=1e-3,
                    optimizer_type="Adafactor",
                    optimizer_args={"scale_parameter": False, "warmup_init": True})
    assert [e.lr for e in sink.of(Step)] == pytest.approx([1e-6, 2e-6])


def test_prodigy_reports_d_times_lr_and_notes_a_rate_far_from_one(tmp_path):
    sink, result = train(tmp_path, optimizer_type="Prodigy", learning_rate=0.05)
    steps = sink.of(Step)
    assert steps[-1].lr == pytest.approx(d_times_lr(result)) and steps[-1].lr != 0.05
    assert any("far from the 1.0" in e.message and e.level == "warning" for e in sink.of(Log))


def d_times_lr(result) -> float:
    """d * lr of the first group, from the optimizer state saved with the final output."""
    folder = next(Path(result.output_path).parent.glob("*-state"))
    group = torch.load(folder / "optimizer.pt", weights_only=True)["param_groups"][0]
    return group["d"] * group["lr"]


def test_adaptive_optimizers_note_a_learning_rate_far_from_one():
    for name in ("DAdaptAdam", "Prodigy", "DAdaptLion"):
        assert "far from the 1.0" in lr_notes(section(name, learning_rate=1e-4))[0]
        assert not lr_notes(section(name, learning_rate=1.0))
    assert not lr_notes(section("AdamW", learning_rate=1e-4))


def test_schedule_free_saves_its_averaged_weights(prepared, tmp_path):
    from trainer.run.outputs import save_checkpoint
    from trainer.run.reporter import Reporter

    s, _, groups, _ = prepared
    params = [p for g in groups for p in g["params"]]
    optimizer, kept = make_optimizer(section("AdamWScheduleFree"), groups, "cpu"), s.optimizer
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
    y = [p.detach().clone() for p in params]
    with averaged_weights(optimizer):  # the library's eval(): x
        x = [p.detach().clone() for p in params]
    s.optimizer = optimizer
    try:
        path = save_checkpoint(s, Reporter(NullSink(), Control()), 1, 2, "-sf", 0.0)
    finally:
        s.optimizer = kept
    saved = [t for k, t in load_file(str(path)).items() if not k.endswith(".alpha")]

    def fingerprint(tensors):  # kohya's names differ from the modules': compare the contents
        return sorted(round(float(t.double().abs().sum()), 5) for t in tensors)

    assert fingerprint(saved) == pytest.approx(fingerprint(x), rel=1e-5)
    assert fingerprint(saved) != pytest.approx(fingerprint(y), rel=1e-5)
    assert all(torch.equal(p, p0) for p, p0 in zip(params, y))  # training goes on from y


@pytest.mark.parametrize("name, extra", [
    ("DAdaptAdam", {"learning_rate": 1.0}),
    ("AdamWScheduleFree", {"learning_rate": 1e-2, "lr_warmup_steps": 4}),
])
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, name, extra):
    from test_resume import config, losses, stop_and_resume

    sections = {"optimizer": {"optimizer_type": name, **extra},
                "training": {"max_train_steps": 4}}
    straight = ListSink()
    result = run(config(tmp_path, "straight", **sections), straight)
    assert result.status == "finished", result.error
    both, resumed, _ = stop_and_resume(config(tmp_path, "resumed", **sections), 2)
    assert both == losses(straight)
    a, b = load_file(result.output_path), load_file(resumed.output_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    lrs = [e.lr for e in straight.of(Step)]
    if name == "AdamWScheduleFree":  # its own warm-up, reported
        assert lrs == pytest.approx([0.0025, 0.005, 0.0075, 0.01])
    else:  # the step size D-Adaptation applies, from the state saved at the end
        assert lrs[-1] == pytest.approx(d_times_lr(result)) and lrs[-1] != 1.0


def test_averaged_weights_swaps_in_x_and_puts_y_back_exactly():
    param = torch.nn.Parameter(torch.randn(8, 8))
    optimizer = make_optimizer(section("SGDScheduleFree", learning_rate=0.1),
                               [{"params": [param]}], "cpu")
    for _ in range(2):
        (param ** 2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    y = param.detach().clone()
    with averaged_weights(optimizer):
        x = param.detach().clone()
    assert not torch.equal(x, y) and torch.equal(param, y)
    assert optimizer.param_groups[0]["train_mode"]


@pytest.mark.parametrize("bad, message", [
    ({"optimizer_type": "AdamWScheduleFree", "lr_scheduler": "cosine"}, "must be 'constant'"),
    ({"optimizer_type": "AdamW", "lr_scheduler": "adafactor"}, "needs optimizer.optimizer_type"),
    ({"optimizer_type": "Adafactor", "optimizer_args": {"relative_step": True}},
     "set optimizer.lr_scheduler = 'adafactor'"),
    ({"lr_scheduler": "cosine_with_min_lr"}, "optimizer.lr_scheduler_args.min_lr_rate"),
    ({"lr_scheduler": "warmup_stable_decay"}, "num_decay_steps"),
])
def test_pairs_that_cannot_work_are_refused_at_load(bad, message):
    with pytest.raises(ValueError, match=message):
        section(bad.pop("optimizer_type", "AdamW"), **bad)


def test_bitsandbytes_refusal_names_the_option_and_the_alternative():
    param = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(OptimizerError, match="'PagedLion8bit'.*mps device; use 'Lion'"):
        make_optimizer(section("PagedLion8bit"), [{"params": [param]}], "mps")
    with pytest.raises(OptimizerError, match="optimizer.optimizer_args for 'DAdaptLion'"):
        make_optimizer(section("DAdaptLion", optimizer_args={"nonsense": 1}),
                       [{"params": [param]}], "cpu")


def test_the_new_schedules_follow_their_definitions():
    param = torch.nn.Parameter(torch.zeros(4))
    cases = {"cosine_with_min_lr": ({"min_lr_rate": 0.1}, 0.1),
             "warmup_stable_decay": ({"num_decay_steps": 4, "min_lr_ratio": 0.2}, 0.2),
             "piecewise_constant": ({"step_rules": "1:3,0.5"}, 0.5),
             "inverse_sqrt": ({"timescale": 1}, 11 ** -0.5)}  # 1/sqrt((t + 1) / 1)
    for name, (args, last) in cases.items():
        sec = section("AdamW", learning_rate=1.0, lr_scheduler=name, lr_scheduler_args=args)
        optimizer = make_optimizer(sec, [{"params": [param]}], "cpu")
        scheduler = make_scheduler(sec, optimizer, 10)
        for _ in range(10):  # the last step: each schedule at its end value
            optimizer.step()
            scheduler.step()
        assert scheduler.get_last_lr()[0] == pytest.approx(last, abs=1e-9), name


def test_the_run_panel_labels_an_effective_learning_rate(tmp_path):
    from kohya_gui import progress
    from kohya_gui.job_state import JobState

    for name, label in (("AdamW", "learning rate"),
                        ("Prodigy", "effective learning rate (d x lr)")):
        job = SimpleNamespace(id="j", label="lora: x",
                              cfg=small_config(tmp_path, tmp_path, optimizer={
                                  "optimizer_type": name}))
        state = JobState(job)
        state.apply(Step(1, 2, 1, 0.5, 0.5, 3e-5, 1.0, 1.0))
        html = progress.progress_html({**state.to_dict(), "status": "running"})
        assert f"<b>{label}</b> 3e-05" in html


def test_the_advisor_counts_every_optimizer_state():
    from trainer.advisor.estimate import optimizer_state_bytes

    step = SimpleNamespace(trained=1000, factored=30)
    sizes = {n: optimizer_state_bytes(n, step, 4) for n in OPTIMIZERS}
    assert sizes["AdamW"] == 8000 and sizes["AdamW8bit"] == 2000 and sizes["Adafactor"] == 120
    assert sizes["DAdaptAdam"] == 12000 and sizes["SGDScheduleFree"] == 4000


def test_optimizer_args_pass_through_over_sd_scripts_defaults():
    param = torch.nn.Parameter(torch.zeros(4))
    lion = make_optimizer(section("Lion", optimizer_args={"betas": [0.8, 0.9]}),
                          [{"params": [param]}], "cpu")
    assert lion.param_groups[0]["betas"] == (0.8, 0.9)
    sgd = make_optimizer(section("SGDNesterov"), [{"params": [param]}], "cpu")
    assert sgd.param_groups[0]["nesterov"] and sgd.param_groups[0]["momentum"] == 0.9
    sgd = make_optimizer(section("SGDNesterov", optimizer_args={"momentum": 0.5}),
                         [{"params": [param]}], "cpu")
    assert sgd.param_groups[0]["momentum"] == 0.5
    ada = make_optimizer(section("Adafactor", lr_scheduler="adafactor"),
                         [{"params": [param], "lr": 1e-3}], "cpu")
    assert ada.param_groups[0]["relative_step"] and ada.param_groups[0]["lr"] is None
