"""Speed settings: text-encoder outputs cached whenever that gives the same run, torch.compile
of the UNet, the fused AdamW kernel, and bitsandbytes imported only for 8-bit optimizers."""

import subprocess
import sys

import pytest
import torch
from train_helpers import one_image_dataset, small_config

from trainer.config.paths import PROJECT_ROOT
from trainer.events import Log, Step
from trainer.run.loop import run
from trainer.system import speed


class Sink:
    def __init__(self):
        self.events = []

    def emit(self, event):
        self.events.append(event)

    def losses(self):
        return [e.loss for e in self.events if isinstance(e, Step)]


def counting_encoder(monkeypatch):
    """Count how many captions the text encoder encodes during a run."""
    import trainer.run.caches
    import trainer.run.step

    calls = []
    real = trainer.run.step.encode_captions

    def counted(model, captions, clip_skip):
        calls.append(len(captions))
        return real(model, captions, clip_skip)

    monkeypatch.setattr(trainer.run.step, "encode_captions", counted)
    monkeypatch.setattr(trainer.run.caches, "encode_captions", counted)
    return calls


def test_frozen_text_encoder_outputs_are_cached_by_default(tmp_path, monkeypatch):
    data = one_image_dataset(tmp_path / "data")
    calls = counting_encoder(monkeypatch)
    auto = Sink()
    cfg = small_config(tmp_path / "auto", data, training={"max_train_steps": 4})
    assert cfg.dataset.cache_text_encoder_outputs is None
    assert run(cfg, auto).status == "finished"
    assert sum(calls) == 1  # the one caption, once, not once per step
    calls.clear()
    off = Sink()
    cfg = small_config(tmp_path / "off", data, training={"max_train_steps": 4},
                       dataset={"cache_text_encoder_outputs": False})
    assert run(cfg, off).status == "finished"
    assert sum(calls) == 4
    assert auto.losses() == pytest.approx(off.losses(), rel=1e-5)


def test_captions_that_change_per_step_are_encoded_every_step(tmp_path, monkeypatch):
    calls = counting_encoder(monkeypatch)
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data", caption="a, red, circle"),
                       training={"max_train_steps": 3}, dataset={"shuffle_caption": True})
    assert run(cfg, Sink()).status == "finished"
    assert sum(calls) == 3


def test_compiled_unet_trains_like_the_eager_one(tmp_path, monkeypatch):
    """Graph capture through dynamo on the LoRA UNet; the 'eager' backend skips the C++ code
    generation, which is the compiler's business, not ours."""
    data = one_image_dataset(tmp_path / "data")
    eager = Sink()
    assert run(small_config(tmp_path / "e", data), eager).status == "finished"
    monkeypatch.setenv(speed.ENV_BACKEND, "eager")
    torch._dynamo.reset()
    compiled = Sink()
    cfg = small_config(tmp_path / "c", data, training={"compile": True})
    result = run(cfg, compiled)
    assert result.status == "finished", result.error
    assert any(isinstance(e, Log) and "torch.compile" in e.message for e in compiled.events)
    assert compiled.losses() == pytest.approx(eager.losses(), rel=1e-4)
    from safetensors.torch import load_file

    assert all(k.startswith("lora_unet_") for k in load_file(result.output_path))


def test_compile_without_a_compiler_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv(speed.ENV_BACKEND, raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(speed.shutil, "which", lambda name: None)
    assert "C++ compiler" in speed.compile_problem("cpu")
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       training={"compile": True})
    result = run(cfg, Sink())
    assert result.status == "failed"
    assert result.error.startswith("training.compile is on, but") and "g++" in result.error


def inductor_error_of_an_empty_kernel(folder):
    """What inductor raises on a kernel that a killed compile left empty: its own loader's
    error on a 0-byte .so, wrapped as inductor wraps it."""
    from torch._inductor.codecache import CppCodeCache
    from torch._inductor.exc import InductorError

    kernel = folder / "c3az.main.so"
    kernel.write_bytes(b"")
    try:
        CppCodeCache._load_library_inner(str(kernel), "c3az")
    except Exception as exc:  # noqa: BLE001 - whatever the loader raises is the cause
        return InductorError(exc, None)
    raise AssertionError("an empty library loaded")


def test_a_broken_compile_cache_names_the_folder_to_delete(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    error = inductor_error_of_an_empty_kernel(tmp_path)
    assert speed.broken_compile_cache(RuntimeError("file too short")) is None  # not inductor's
    assert speed.broken_compile_cache(torch._inductor.exc.InductorError(
        ValueError("shapes differ"), None)) is None  # inductor's, but not the cache

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr("trainer.run.step.batch_loss", fails)
    result = run(small_config(tmp_path, one_image_dataset(tmp_path / "data")), Sink())
    assert result.status == "failed"
    assert f"rm -rf {tmp_path / 'inductor'}" in result.error
    assert "training.compile = false" in result.error


def test_adamw_uses_the_fused_kernel_unless_the_arguments_choose():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    assert speed.fused_adamw_kwargs(params, {}) == {"fused": True}
    assert speed.fused_adamw_kwargs(params, {"foreach": False}) == {}
    from trainer.config import OptimizerSection
    from trainer.optim.optimizers import make_optimizer

    opt = make_optimizer(OptimizerSection(), [{"params": params, "lr": 1e-3}], "cpu")
    assert opt.defaults["fused"] is True
    opt = make_optimizer(OptimizerSection(optimizer_args={"foreach": True}),
                         [{"params": params, "lr": 1e-3}], "cpu")
    assert not opt.defaults.get("fused")


def test_bitsandbytes_is_imported_only_for_an_8bit_optimizer():
    code = (
        "import sys, trainer, trainer.run.loop, trainer.run.session, trainer.run.step\n"
        "import peft, diffusers\n"
        "from diffusers import StableDiffusionPipeline, UNet2DConditionModel\n"
        "from peft import LoraConfig, inject_adapter_in_model\n"
        "assert sys.modules.get('bitsandbytes', 'absent') is None, 'imported early'\n"
        "import torch\n"
        "from trainer.config import OptimizerSection\n"
        "from trainer.optim.optimizers import make_optimizer\n"
        "p = [torch.nn.Parameter(torch.zeros(64))]\n"
        "opt = make_optimizer(OptimizerSection(optimizer_type='AdamW8bit'), [{'params': p}], "
        "'cpu')\n"
        "print(type(opt).__module__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("bitsandbytes.optim")
    # and quiet: what the libraries log on the way (bitsandbytes' optional CPU kernel, the image
    # processors' fallback) is debug-level chatter (trainer.system.quiet), so nothing reaches
    # stderr, whatever the libraries' wording
    assert proc.stderr == ""
