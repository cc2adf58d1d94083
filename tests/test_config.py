"""The config schema and its TOML I/O: round trips, every error kind, generated files."""

import subprocess
import sys
import typing
from pathlib import Path

import pytest

from trainer.config import SECTIONS, TrainConfig, iter_fields, ui_hints
from trainer.config import files as config_io
from trainer.config.files import ConfigError, dumps, from_dict, load

ROOT = Path(__file__).resolve().parent.parent


def _problems(data):
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    return info.value.problems


def test_round_trip_full_and_partial(tmp_path):
    cfg = from_dict({
        "mode": "lora",
        "dataset": {"resolution": 768, "caption_prefix": "photo of", "keep_tokens": 0},
        "optimizer": {"optimizer_args": {"d_coef": 2.0, "safeguard_warmup": True}},
        "training": {"max_train_steps": 10, "noise_offset": 0.0},
        "sampling": {"sample_prompts": ["a cat", "a dog"]},
    })
    assert from_dict(config_io.load_toml_text(dumps(cfg))) == cfg
    assert from_dict(config_io.load_toml_text(dumps(cfg, only_changed=True))) == cfg
    path = config_io.save(cfg, tmp_path / "c.toml")
    assert load(path) == cfg
    # a 0 is a value, not "unset"
    assert cfg.training.noise_offset == 0.0 and "noise_offset = 0.0" in dumps(cfg)


def test_unknown_key_suggests_nearest():
    assert _problems({"optimizer": {"learning_rat": 1e-4}}) == [
        "optimizer.learning_rat: unknown key; did you mean 'optimizer.learning_rate'?"]
    # the right name in the wrong section
    msg = _problems({"training": {"learning_rate": 1e-4}})[0]
    assert "training.learning_rate: unknown key" in msg and "optimizer.learning_rate" in msg
    assert _problems({"sectionx": {}})[0].startswith("sectionx: unknown key")


def test_wrong_type_names_path_and_value():
    msg = _problems({"dataset": {"resolution": "big"}})[0]
    assert msg.startswith("dataset.resolution = 'big':") and "integer" in msg


def test_out_of_range_says_what_is_allowed():
    assert _problems({"training": {"train_batch_size": 0}}) == [
        "training.train_batch_size = 0: must be >= 1"]
    assert _problems({"dataset": {"resolution": 500}}) == [
        "dataset.resolution = 500: must be a multiple of 8"]
    msg = _problems({"optimizer": {"optimizer_type": "adam"}})[0]
    assert msg.startswith("optimizer.optimizer_type = 'adam': must be one of") and "'AdamW'" in msg


def test_every_problem_is_reported_at_once():
    problems = _problems({"mode": "x", "training": {"train_batch_size": -1, "seeed": 1}})
    assert len(problems) == 3


def test_cross_field_checks_name_both_fields():
    msg = _problems({"dataset": {"min_bucket_reso": 1024, "max_bucket_reso": 512}})[0]
    assert "dataset.min_bucket_reso" in msg and "dataset.max_bucket_reso" in msg
    assert "network.token_string" in _problems({"mode": "textual_inversion"})[0]


def test_overrides_parse_toml_values_and_refuse_unknown_keys(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[training]\nmax_train_steps = 5\n")
    cfg = load(path, ["optimizer.learning_rate=2e-4", "dataset.flip_aug=true",
                      "saving.output_name=my lora", "sampling.sample_prompts=['a', 'b']"])
    assert cfg.optimizer.learning_rate == 2e-4 and cfg.dataset.flip_aug is True
    assert cfg.saving.output_name == "my lora" and cfg.sampling.sample_prompts == ["a", "b"]
    with pytest.raises(ConfigError, match="did you mean 'optimizer.learning_rate'"):
        load(path, ["optimizer.learning_rat=1"])


def test_broken_toml_and_missing_file_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load(bad)
    with pytest.raises(ConfigError, match="nope.toml: file not found"):
        load(tmp_path / "nope.toml")


def test_newer_schema_version_is_refused():
    assert "schema_version = 99" in _problems({"schema_version": 99})[0]


def test_cli_config_error_exits_2_without_traceback(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[optimizer]\nlearning_rat = 1\n")
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", str(path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "did you mean 'optimizer.learning_rate'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_field_has_help_hints_and_optional_defaults_none():
    for section, name, info in iter_fields():
        assert info.description, f"{section}.{name} has no help"
        hints = ui_hints(info)
        assert hints["modes"] and isinstance(hints["advanced"], bool)
        optional = type(None) in typing.get_args(info.annotation)
        if optional:  # absent from TOML means None, so an Optional default must be None
            assert info.default is None, f"{section}.{name}"
    assert set(SECTIONS) == {"model", "dataset", "network", "optimizer", "training", "flow",
                             "sampling", "saving"}


def test_config_example_is_fresh():
    text = (ROOT / "config_example.toml").read_text(encoding="utf-8")
    assert text == config_io.example_toml(), "run: python -m trainer example-config"
    assert from_dict(config_io.load_toml_text(text)) == TrainConfig()


@pytest.mark.parametrize("preset", sorted((ROOT / "presets").glob("*/*.toml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_presets_validate_and_are_canonical(preset):
    cfg = load(preset)
    assert cfg.mode == preset.parent.name
    # presets are written by the same dumper, so loading and saving gives the same text (a
    # preset may start with comment lines that tell the user why its values are what they are)
    lines = preset.read_text(encoding="utf-8").splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    assert dumps(cfg, only_changed=True) == "".join(lines)


def test_there_is_a_preset_per_mode():
    for mode in ("lora", "dreambooth", "textual_inversion"):
        assert list((ROOT / "presets" / mode).glob("*.toml")), mode
