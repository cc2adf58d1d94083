"""Keep the last N saves (saving.save_last_n_epochs / _steps and their _state twins): what stays
is what sd-scripts' removal rules (written out here from library/train_util.py) leave, and an
older save goes only once the newer one is on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import one_image_dataset, small_config

from trainer.config.files import ConfigError, from_dict
from trainer.events import ListSink
from trainer.run.keep_last import keep_last
from trainer.run.loop import run


def sd_scripts_step_removed(step: int, keep: int, every: int):
    """get_remove_step_no: the one step save sd-scripts deletes after saving at ``step``."""
    r = step - keep - 1
    r -= r % every
    return None if r < 0 else r


def sd_scripts_epoch_removed(epoch: int, keep: int, every: int):
    """get_remove_epoch_no."""
    r = epoch - every * keep
    return None if r < 0 else r


class Cfg:
    def __init__(self, out: Path, **saving):
        values = {"output_dir": str(out), "output_name": "run", "save_state": True,
                  "save_every_n_epochs": None, "save_every_n_steps": None,
                  "save_last_n_epochs": None, "save_last_n_epochs_state": None,
                  "save_last_n_steps": None, "save_last_n_steps_state": None, **saving}
        self.saving = type("Saving", (), values)


def fake_save(out: Path, stem: str, state_step: int, epoch: int, position: int) -> None:
    (out / f"{stem}.safetensors").write_bytes(b"x")
    (out / f"{stem}.toml").write_text("")
    state = out / f"run-step{state_step:08d}-state"
    state.mkdir()
    (state / "trained.safetensors").write_bytes(b"x")
    (state / "progress.json").write_text(json.dumps(
        {"step": state_step, "epoch": epoch, "position": position}))


def test_step_saves_keep_what_sd_scripts_keeps(tmp_path):
    every, keep, keep_state = 10, 30, 15
    cfg = Cfg(tmp_path, save_every_n_steps=every, save_last_n_steps=keep,
              save_last_n_steps_state=keep_state)
    files, states = set(), set()
    for step in range(every, 101, every):
        fake_save(tmp_path, f"run-step{step:08d}", step, 1, step)  # mid-epoch states
        keep_last(cfg, f"-step{step:08d}", 1, step)
        files.add(step)
        states.add(step)
        files.discard(sd_scripts_step_removed(step, keep, every))
        states.discard(sd_scripts_step_removed(step, keep_state, every))
    on_disk = {int(p.stem[-8:]) for p in tmp_path.glob("run-step*.safetensors")}
    assert on_disk == files == {70, 80, 90, 100}
    assert {int(p.name[8:16]) for p in tmp_path.glob("*-state")} == states == {90, 100}
    assert {int(p.stem[-8:]) for p in tmp_path.glob("run-step*.toml")} == files


def test_epoch_saves_and_states_keep_the_last_n(tmp_path):
    every, keep = 2, 2
    cfg = Cfg(tmp_path, save_every_n_epochs=every, save_last_n_epochs=keep)
    files = set()
    mid_step_state = tmp_path / "run-step00000003-state"  # a step state: never an epoch's
    mid_step_state.mkdir()
    (mid_step_state / "progress.json").write_text('{"step": 3, "epoch": 1, "position": 3}')
    for epoch in range(every, 13, every):
        # an epoch-end state: the progress starts the next epoch at batch 0
        fake_save(tmp_path, f"run-{epoch:06d}", 5 * epoch, epoch + 1, 0)
        keep_last(cfg, f"-{epoch:06d}", epoch, 5 * epoch)
        files.add(epoch)
        files.discard(sd_scripts_epoch_removed(epoch, keep, every))
    assert {int(p.stem[-6:]) for p in tmp_path.glob("run-0*.safetensors")} == files == {10, 12}
    states = {int(p.name[8:16]) for p in tmp_path.glob("*-state")}
    assert states == {3, 50, 60}  # the states of epochs 10 and 12, and the step state


def test_other_names_and_the_final_save_are_left_alone(tmp_path):
    cfg = Cfg(tmp_path, save_every_n_steps=1, save_last_n_steps=1, save_state=False)
    for name in ("run-step00000001", "runner-step00000001", "run-step00000002"):
        (tmp_path / f"{name}.safetensors").write_bytes(b"x")
    assert keep_last(cfg, "", 1, 9) == []
    gone = keep_last(cfg, "-step00000003", 1, 3)
    assert [p.name for p in gone] == ["run-step00000001.safetensors"]
    assert (tmp_path / "runner-step00000001.safetensors").exists()


def test_refused_without_the_saves_they_count():
    with pytest.raises(ConfigError, match="saving.save_last_n_epochs .*save_every_n_epochs"):
        from_dict({"saving": {"save_last_n_epochs": 2}})
    with pytest.raises(ConfigError, match="saving.save_last_n_steps_state.*save_state"):
        from_dict({"saving": {"save_last_n_steps_state": 2, "save_every_n_steps": 5}})


def steps_of(out: Path, pattern: str) -> list[int]:
    return sorted(int(p.name.split("-step")[1][:8]) for p in out.glob(pattern))


def test_a_run_keeps_the_last_saves_and_deletes_only_after_the_newer_one(tmp_path,
                                                                        monkeypatch):
    data = one_image_dataset(tmp_path / "data")
    saving = {"save_every_n_steps": 1, "save_last_n_steps": 1, "save_state": True,
              "output_name": "run"}
    cfg = small_config(tmp_path, data, training={"max_train_steps": 4}, saving=saving)
    out = Path(cfg.saving.output_dir)
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    # step 3 (the last intermediate save) keeps the saves of steps >= 3 - 1
    assert steps_of(out, "run-step*.safetensors") == [2, 3]
    assert steps_of(out, "run-step*-state") == [2, 3, 4]  # 4: the final save's state
    assert (out / "run.safetensors").is_file()

    # the step-3 save fails: the step-1 save it would have replaced stays
    import trainer.run.state as state

    real = state.save_state

    def failing(s, progress):
        if progress.step == 3:
            raise OSError("disk gone")
        return real(s, progress)

    monkeypatch.setattr(state, "save_state", failing)
    out2 = tmp_path / "out2"
    cfg2 = cfg.model_copy(update={"saving": cfg.saving.model_copy(
        update={"output_dir": str(out2)})})
    assert run(cfg2, ListSink()).status == "failed"
    assert steps_of(out2, "run-step*.safetensors") == [1, 2, 3]
    assert steps_of(out2, "run-step*-state") == [1, 2]


def test_kohya_ss_keys_import_as_sd_scripts_reads_them():
    from trainer.importers.kohya import import_kohya

    base = {"LoRA_type": "Standard", "save_every_n_steps": 50, "save_every_n_epochs": 1,
            "save_state": True}
    cfg, report = import_kohya({**base, "save_last_n_epochs": 3, "save_last_n_epochs_state": 2,
                                "save_last_n_steps": 200, "save_last_n_steps_state": "0"})
    assert not report.unsupported, report.unsupported
    sv = cfg.saving
    assert (sv.save_last_n_epochs, sv.save_last_n_epochs_state) == (3, 2)
    assert (sv.save_last_n_steps, sv.save_last_n_steps_state) == (200, None)
    # the shipped SDXL preset: save_last_n_steps_state = 1 with no step saves
    cfg, report = import_kohya({"LoRA_type": "Standard", "save_every_n_steps": 0,
                                "save_last_n_steps_state": 1, "save_last_n_steps": 0})
    assert not report.unsupported and cfg.saving.save_last_n_steps_state is None
    assert [k for k, _ in report.not_needed] == ["save_last_n_steps_state"]
    _, report = import_kohya({"LoRA_type": "Standard", "save_every_n_steps": 10,
                              "save_last_n_steps_state": 30})
    assert "save_state" in dict(report.not_needed)["save_last_n_steps_state"]
    cfg, _ = import_kohya({"LoRA_type": "Standard", "save_every_n_epochs": 2,
                           "additional_parameters": "--save_last_n_epochs 4"})
    assert cfg.saving.save_last_n_epochs == 4
