"""Issue 21: training.log_with = 'wandb' / 'all' through accelerate's trackers, beside
TensorBoard, with sd-scripts' log_tracker_name and wandb_run_name. W&B runs offline (no account,
no network: WANDB_MODE=offline) and must write its run under the logging dir; the names are
read back from the files the trackers wrote."""

from __future__ import annotations

import pytest
from train_helpers import one_image_dataset, small_config

from trainer.config.files import ConfigError, from_dict
from trainer.importers.kohya import import_kohya
from trainer.run import trackers
from trainer.run.loop import run


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir"),
                        "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_names_and_arguments(tmp_path):
    cfg = from_dict({"training": {"log_with": "all", "log_tracker_name": "cats v2",
                                  "wandb_run_name": "first"}})
    assert trackers.log_with(cfg) == ["tensorboard", "wandb"]
    assert trackers.project_name(cfg) == "cats v2"
    assert trackers.init_kwargs(cfg, tmp_path / "logs") == {
        "wandb": {"dir": str(tmp_path / "logs"), "name": "first"}}
    plain = from_dict({})
    assert trackers.log_with(plain) == ["tensorboard"]
    assert trackers.init_kwargs(plain, tmp_path) == {}
    assert trackers.project_name(plain) == plain.saving.output_name
    with pytest.raises(ConfigError, match="training.log_tracker_name"):
        from_dict({"training": {"log_tracker_name": "../up"}})


def test_kohya_keys_import():
    cfg, report = import_kohya({"LoRA_type": "Standard", "log_with": "wandb",
                                "log_tracker_name": "cats", "wandb_run_name": "r1",
                                "wandb_api_key": ""})
    assert (cfg.training.log_with, cfg.training.log_tracker_name,
            cfg.training.wandb_run_name) == ("wandb", "cats", "r1")
    assert not report.unsupported and not report.notes


def test_two_steps_log_to_tensorboard_and_offline_wandb(tmp_path, offline_wandb):
    data = one_image_dataset(tmp_path / "data")
    logs = tmp_path / "logs"
    cfg = small_config(tmp_path, data, training={
        "max_train_steps": 2, "log_with": "all", "logging_dir": str(logs),
        "log_tracker_name": "cats-run", "wandb_run_name": "first-try"})
    result = run(cfg)
    assert result.status == "finished", result.error
    assert list((logs / "cats-run").rglob("events.out.tfevents.*"))  # TensorBoard, named
    (run_dir,) = (logs / "wandb").glob("offline-run-*")  # W&B, under the logging dir
    (record,) = run_dir.glob("run-*.wandb")
    raw = record.read_bytes()
    assert b"first-try" in raw and b"cats-run" in raw  # the run's name and its project
    assert not (tmp_path / "wandb-dir").exists() or not list((tmp_path / "wandb-dir")
                                                             .rglob("*.wandb"))
