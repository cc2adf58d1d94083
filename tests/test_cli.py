"""`python -m trainer`: train from a preset with overrides, and refuse what cannot run."""

import subprocess
import sys

import pytest
import torch

from trainer.config import OptimizerSection
from trainer.optim import OptimizerError, make_optimizer
from trainer.paths import PROJECT_ROOT


def test_cli_trains_the_default_preset_with_overrides(tmp_path, studio_home):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "presets/lora/default.toml",
         "--set", "training.max_train_steps=3", "--set", f"saving.output_dir='{out}'",
         "--set", "saving.output_name=cli"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "cli.safetensors").is_file() and (out / "cli.toml").is_file()
    assert "finished at step 3" in proc.stdout
    assert "3/3" in proc.stderr  # the tqdm bar


def test_cli_reports_a_failed_run_with_status_1(tmp_path, studio_home):
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "presets/lora/default.toml",
         "--set", "dataset.train_data_dir='/nowhere'"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 1 and "dataset.train_data_dir" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_8bit_optimizers_name_the_alternative_where_unsupported():
    param = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(OptimizerError, match="no 8-bit optimizers for the mps device; use 'AdamW'"):
        make_optimizer(OptimizerSection(optimizer_type="AdamW8bit"), [{"params": [param]}], "mps")
    with pytest.raises(OptimizerError, match="use 'Lion'"):
        make_optimizer(OptimizerSection(optimizer_type="Lion8bit"), [{"params": [param]}], "mps")
