"""training.log_with = 'none' from the GUI: the form's value goes through the mode tab's Train
handler into the GUI's runner (the real trainer, in the studio's process, after a TensorBoard run
in the same process, as a user of the page would run them). Reported once as failing there with
``KeyError: 'accelerate'`` while in-process runs from Python worked; both must finish, and only
the TensorBoard run writes event files."""

from __future__ import annotations

import time

from gui_helpers import DEFAULT_PRESET, gui_home, one_torch_thread  # noqa: F401

from kohya_gui.fields import Form
from kohya_gui.runner import Runner
from kohya_gui.tabs import mode_tab
from trainer.config import files as config_io


def event_files(folder):
    return list(folder.rglob("events.out.tfevents.*"))


def test_log_with_none_from_the_form(gui_home, one_torch_thread, tmp_path):  # noqa: F811
    form = Form("lora")
    runner = Runner(history_path=tmp_path / "jobs.json")  # as the app builds it
    try:
        for tracker in ("tensorboard", "none"):
            out = tmp_path / tracker
            values = form.values(config_io.load(DEFAULT_PRESET))
            values.update({"saving.output_dir": str(out), "training.max_train_steps": 2,
                           "training.log_with": tracker})
            answer = mode_tab.train(form, values, runner, True)
            assert "started" in answer or "queued" in answer, answer
            time.sleep(0.2)
            assert runner.wait_idle(300)
            snap = runner.snapshot()
            assert snap["status"] == "finished", (tracker, snap["error"], snap["log"][-5:])
            assert (out / "default-lora.safetensors").is_file()
            assert bool(event_files(out)) == (tracker == "tensorboard")
            assert f"log_with = \"{tracker}\"" in (out / "default-lora.toml").read_text()
    finally:
        runner.close()
