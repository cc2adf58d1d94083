"""training.log_tracker_config (sd-scripts' --log_tracker_config): a TOML of init arguments per
tracker, passed to accelerate's init_trackers over the W&B name and folder; a 2-step run whose
TensorBoard writer takes the file's filename_suffix."""

from __future__ import annotations

import pytest
from train_helpers import one_image_dataset, small_config

from trainer.config.files import from_dict
from trainer.importers.kohya import import_kohya
from trainer.run import trackers
from trainer.run.loop import run


def test_the_file_goes_to_each_tracker_over_ours(tmp_path):
    toml = tmp_path / "trackers.toml"
    toml.write_text('[wandb]\nname = "from-file"\ntags = ["a", "b"]\n'
                    '[tensorboard]\nflush_secs = 5\n')
    cfg = from_dict({"training": {"log_with": "all", "wandb_run_name": "mine",
                                  "log_tracker_config": str(toml)}})
    assert trackers.init_kwargs(cfg, tmp_path / "logs") == {
        "wandb": {"dir": str(tmp_path / "logs"), "name": "from-file", "tags": ["a", "b"]},
        "tensorboard": {"flush_secs": 5}}
    toml.write_text("flush_secs = 5\n")
    with pytest.raises(ValueError, match="training.log_tracker_config.*flush_secs"):
        trackers.init_kwargs(cfg, tmp_path / "logs")
    toml.write_text("[wandb\n")
    with pytest.raises(ValueError, match="training.log_tracker_config.*TOML"):
        trackers.init_kwargs(cfg, tmp_path / "logs")
    missing = from_dict({"training": {"log_tracker_config": str(tmp_path / "none.toml")}})
    with pytest.raises(ValueError, match="training.log_tracker_config"):
        trackers.init_kwargs(missing, tmp_path / "logs")


def test_kohya_key_imports():
    cfg, report = import_kohya({"LoRA_type": "Standard", "log_tracker_config": "/x/t.toml"})
    assert cfg.training.log_tracker_config == "/x/t.toml" and not report.unsupported


def test_two_steps_pass_the_file_to_tensorboard(tmp_path):
    toml = tmp_path / "trackers.toml"
    toml.write_text('[tensorboard]\nfilename_suffix = ".fromtoml"\n')
    data = one_image_dataset(tmp_path / "data")
    logs = tmp_path / "logs"
    cfg = small_config(tmp_path, data, training={
        "max_train_steps": 2, "log_with": "tensorboard", "logging_dir": str(logs),
        "log_tracker_config": str(toml)})
    result = run(cfg)
    assert result.status == "finished", result.error
    events = [p.name for p in logs.rglob("events.out.tfevents.*")]
    assert any(name.endswith(".fromtoml") for name in events), events  # the run's writer
