"""`python -m trainer`: train from a preset with overrides, and refuse what cannot run."""

import subprocess
import sys

import pytest
import torch

from trainer.config import OptimizerSection
from trainer.config.paths import PROJECT_ROOT
from trainer.optim.optimizers import OptimizerError, make_optimizer


def test_cli_trains_the_default_preset_with_overrides(tmp_path, studio_home):
    """Written to a file (``> run.log 2>&1``), the output is whole lines: the progress is one
    plain line per update, with no carriage return and no log line glued into it."""
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", "train", "presets/lora/default.toml",
             "--set", "training.max_train_steps=3", "--set", f"saving.output_dir='{out}'",
             "--set", "saving.output_name=cli"],
            stdout=f, stderr=subprocess.STDOUT, text=True, cwd=PROJECT_ROOT, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text[-2000:]
    assert (out / "cli.safetensors").is_file() and (out / "cli.toml").is_file()
    assert "\r" not in text
    lines = text.splitlines()
    assert "finished at step 3: " + str(out / "cli.safetensors") in lines
    steps = [line for line in lines if "/3 (" in line]
    assert steps[0].startswith("1/3 (33%), ") and steps[-1].startswith("3/3 (100%), ")
    assert all(line.split(" (")[0] in ("1/3", "2/3", "3/3") for line in steps), steps
    assert any(line.startswith("Device: CPU") for line in lines)  # a log line, whole


def test_cli_reports_a_failed_run_with_status_1(tmp_path, studio_home):
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "presets/lora/default.toml",
         "--set", "dataset.train_data_dir='/nowhere'"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 1 and "dataset.train_data_dir" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_8bit_optimizers_name_the_alternative_where_unsupported():
    param = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(OptimizerError, match="no 8-bit or paged optimizers for the mps device; "
                       "use .AdamW."):
        make_optimizer(OptimizerSection(optimizer_type="AdamW8bit"), [{"params": [param]}], "mps")
    with pytest.raises(OptimizerError, match="use 'Lion'"):
        make_optimizer(OptimizerSection(optimizer_type="Lion8bit"), [{"params": [param]}], "mps")


def test_console_shows_the_class_images_bar_then_the_steps(capsys):
    from trainer.cli import ConsoleSink
    from trainer.events import Finished, Log, Progress, Started, Step

    sink = ConsoleSink(terminal=True)
    sink.emit(Log("Generating class images: 10 of 10 into /tmp/reg/1_dog"))
    for done in (4, 8, 10):
        sink.emit(Progress("Generating class images", done, 10))
    sink.emit(Started(total_steps=2, epochs=1, steps_per_epoch=2, num_images=2,
                      num_repeated_images=2, batch_size=1, gradient_accumulation_steps=1,
                      buckets={"64x64": 2}, device="CPU", mixed_precision="no",
                      output_dir="/tmp/out"))
    for step in (1, 2):
        sink.emit(Step(step, 2, 1, 0.5, 0.5, 1e-4, 2.0, 0.0))
    sink.emit(Finished("finished", 2, output_path="/tmp/out/x.safetensors"))
    out, err = capsys.readouterr()
    assert "Generating class images: 10 of 10" in out
    assert "finished at step 2: /tmp/out/x.safetensors" in out
    assert "Generating class images: 100%" in err and "10/10" in err  # its own bar, closed
    assert "2/2" in err and err.index("10/10") < err.index("2/2")  # then the steps' bar


def test_console_off_a_terminal_prints_a_line_every_tenth_of_the_way(capsys):
    from trainer.cli import ConsoleSink
    from trainer.events import Finished, Log, Progress, Started, Step

    sink = ConsoleSink(terminal=False)
    for done in range(1, 5):
        sink.emit(Progress("Caching latents", done, 4))
    sink.emit(Started(total_steps=100, epochs=1, steps_per_epoch=100, num_images=1,
                      num_repeated_images=100, batch_size=1, gradient_accumulation_steps=1,
                      buckets={"64x64": 100}, device="CPU", mixed_precision="no",
                      output_dir="/tmp/out"))
    for step in range(1, 101):
        sink.emit(Step(step, 100, 1, 0.5, 0.25, 1e-4, 2.0, 1.0))
        if step == 55:
            sink.emit(Log("saved a checkpoint"))
    sink.emit(Finished("finished", 100))
    out, err = capsys.readouterr()
    assert "\r" not in out + err and not err
    lines = out.splitlines()
    assert [line.split(",")[0] for line in lines[:4]] == [
        "Caching latents: 1/4 (25%)", "Caching latents: 2/4 (50%)",
        "Caching latents: 3/4 (75%)", "Caching latents: 4/4 (100%)"]
    steps = [line.split(" (")[0] for line in lines if "/100 (" in line]
    assert steps == ["1/100"] + [f"{n}/100" for n in range(10, 101, 10)]
    assert lines[lines.index("saved a checkpoint") - 1].startswith("50/100 (50%)")
    assert "loss 0.2500" in lines[-2] and lines[-1] == "finished at step 100"
