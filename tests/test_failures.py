"""Failures that say what to do: NaN guard, out of memory, a full disk, a bad output folder, a
corrupt base model. Each ends the run with a message naming the setting or the file, and
nothing already written is lost."""

from __future__ import annotations

import errno

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink
from trainer.run import step as step_module
from trainer.run.loop import run


def cfg_for(tmp_path, **sections):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    return small_config(tmp_path, data, **sections)


def poisoned_loss(bad_step: int, make_bad):
    calls = {"n": 0}
    real = step_module.batch_loss

    def batch_loss(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return make_bad(loss) if calls["n"] == bad_step else loss

    return batch_loss


def test_a_nan_loss_stops_the_run_at_that_step_and_keeps_the_last_file(tmp_path, monkeypatch):
    import trainer.run.step

    monkeypatch.setattr(trainer.run.step, "batch_loss",
                        poisoned_loss(3, lambda x: x * float("nan")))
    cfg = cfg_for(tmp_path, training={"max_train_steps": 4},
                  saving={"save_every_n_steps": 2, "save_precision": "fp32"})
    result = run(cfg)
    assert result.status == "failed" and result.step == 2
    assert "step 3: the loss is nan" in result.error and "learning rate" in result.error
    assert "circle.png" in result.error  # the batch's images
    out = tmp_path / "out"
    assert (out / "default-lora-step00000002.safetensors").is_file()
    assert not (out / "default-lora.safetensors").exists()  # nothing saved from the bad state


def test_a_non_finite_gradient_is_caught_before_the_optimizer_step(tmp_path, monkeypatch):
    from trainer.methods.lora import LoraMethod

    seen = {}
    real_after = LoraMethod.after_step

    def after_step(self, model, step):
        seen[step] = {k: v.clone() for k, v in model.unet.state_dict().items() if "lora" in k}
        return real_after(self, model, step)

    monkeypatch.setattr(LoraMethod, "after_step", after_step)
    import trainer.run.step

    class InfiniteGrad(torch.autograd.Function):  # a finite loss whose gradients are not
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    monkeypatch.setattr(trainer.run.step, "batch_loss", poisoned_loss(2, InfiniteGrad.apply))
    result = run(cfg_for(tmp_path, training={"max_train_steps": 3}))
    assert result.status == "failed" and "step 2: the gradient norm is" in result.error
    assert list(seen) == [1]  # step 2 was never applied


def test_an_absurd_learning_rate_is_named(tmp_path):
    result = run(cfg_for(tmp_path, training={"max_train_steps": 30},
                         optimizer={"optimizer_type": "Lion", "learning_rate": 10.0}))
    assert result.status == "failed", "the run should have diverged"
    assert "not a finite number" in result.error or "gradient norm is" in result.error
    assert "optimizer.learning_rate = 10" in result.error


def test_out_of_memory_gives_advice_for_this_config_and_frees_the_model(tmp_path, monkeypatch):
    import trainer.run.step
    from trainer.run.session import Session

    released = []
    real_release = Session.release
    monkeypatch.setattr(Session, "release", lambda self: (released.append(self.model is not None),
                                                          real_release(self)))

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer.run.step, "batch_loss", oom)
    result = run(cfg_for(tmp_path, training={"train_batch_size": 2}))
    assert result.status == "failed" and "out of device memory at step 1" in result.error
    for advice in ("training.train_batch_size = 1", "training.gradient_checkpointing = true",
                   "optimizer.optimizer_type = 'AdamW8bit'"):
        assert advice in result.error
    assert released == [True]


def test_a_full_disk_keeps_the_previous_file_and_says_so(tmp_path, monkeypatch):
    from trainer.system import safe_write

    cfg = cfg_for(tmp_path, training={"max_train_steps": 2}, saving={"save_precision": "fp32"})
    assert run(cfg).status == "finished"
    out = tmp_path / "out" / "default-lora.safetensors"
    before = load_file(out)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_write, "save_file", full)
    result = run(cfg)
    assert result.status == "failed"
    assert "the disk is full" in result.error and "previous default-lora.safetensors is intact" \
        in result.error
    after = load_file(out)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not list(out.parent.glob(".*.tmp"))


def test_an_output_dir_that_is_a_file_fails_before_the_model_loads(tmp_path, monkeypatch):
    import trainer.models.loader

    monkeypatch.setattr(trainer.models.loader, "load_base_model",
                        lambda *a: pytest.fail("the model was loaded"))
    target = tmp_path / "a-file"
    target.write_text("x")
    result = run(cfg_for(tmp_path, saving={"output_dir": str(target)}))
    assert result.status == "failed" and "saving.output_dir" in result.error
    assert "is a file" in result.error


def test_leftovers_of_a_killed_save_are_cleared(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".default-lora.safetensors.x1.tmp").write_bytes(b"half")
    (out / ".default-lora-step00000001-state.x2.tmp").mkdir()
    assert run(cfg_for(tmp_path, training={"max_train_steps": 1})).status == "finished"
    assert not list(out.glob(".*.tmp"))


def test_a_truncated_base_model_file_is_named(tmp_path):
    from trainer.config import EMBEDDED_MODEL
    from trainer.models.loader import resolve_model_path

    folder = resolve_model_path(EMBEDDED_MODEL)
    data = (folder / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(data[: len(data) // 2])
    result = run(cfg_for(tmp_path, model={"pretrained_model_name_or_path": str(broken)}))
    assert result.status == "failed" and str(broken) in result.error
    assert "Traceback" not in result.error


def test_sinks_see_the_failure_as_the_last_event(tmp_path):
    sink = ListSink()
    result = run(cfg_for(tmp_path, saving={"output_dir": str(tmp_path / "data" / "1_circle" /
                                                              "circle.png")}), sink)
    assert sink.events[-1] == result and result.status == "failed"
