"""Issue 21: training_comment and metadata_tags land in the LoRA file's metadata under the names
sd-scripts writes (train_network.py: ss_training_comment; sai_model_spec.py: modelspec.tags),
imported from kohya_ss, after a 2-step run."""

from __future__ import annotations

import json

from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.importers.kohya import import_kohya
from trainer.run.loop import run


def _metadata(path: str) -> dict[str, str]:
    with safe_open(path, "pt") as f:
        return f.metadata()


def test_imported_and_written_as_sd_scripts_names_them(tmp_path):
    cfg, report = import_kohya({"LoRA_type": "Standard", "training_comment": "trigger: sks",
                                "metadata_tags": "style, anime"})
    assert not report.unsupported
    assert (cfg.saving.training_comment, cfg.saving.metadata_tags) == ("trigger: sks",
                                                                       "style, anime")
    data = one_image_dataset(tmp_path / "data")
    result = run(small_config(tmp_path, data, training={"max_train_steps": 2},
                              saving={"training_comment": "trigger: sks",
                                      "metadata_tags": "style, anime"},
                              dataset={"max_token_length": 150}))
    assert result.status == "finished", result.error
    meta = _metadata(result.output_path)
    assert meta["ss_training_comment"] == "trigger: sks"
    assert meta["modelspec.tags"] == "style, anime"
    assert meta["ss_max_token_length"] == "150"
    assert json.loads(meta["ss_network_args"]) == {}


def test_unset_as_sd_scripts_writes_them(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    result = run(small_config(tmp_path, data, training={"max_train_steps": 1}))
    meta = _metadata(result.output_path)
    assert meta["ss_training_comment"] == "None" and "modelspec.tags" not in meta
