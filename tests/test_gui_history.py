"""The job history outlives the server, and runs with a saved state can be resumed from it."""

from __future__ import annotations

import json

from kohya_gui import history
from trainer.config import TrainConfig
from trainer.config import files as config_io


def a_state(folder, step=3):
    folder.mkdir(parents=True)
    (folder / "progress.json").write_text(json.dumps({"step": step}))
    return folder


def test_history_round_trips_and_a_broken_file_is_set_aside(tmp_path):
    path = tmp_path / "jobs.json"
    entries = [{"job_id": "job-2", "status": "stopped"}, {"job_id": "job-1", "status": "ok"}]
    history.save_history(path, entries)
    assert history.load_history(path) == entries
    path.write_text("{ not json")
    assert history.load_history(path) == []
    assert (tmp_path / "jobs.json.broken").read_text() == "{ not json"


def test_only_runs_with_a_complete_state_and_their_config_can_resume(tmp_path):
    cfg_path = tmp_path / "out" / "run.toml"
    config_io.save(TrainConfig(saving={"output_dir": str(tmp_path / "out")}), cfg_path)
    good = a_state(tmp_path / "out" / "run-step00000003-state")
    entries = [
        {"job_id": "job-4", "status": "stopped", "config_path": str(cfg_path), "state": str(good)},
        {"job_id": "job-3", "status": "stopped", "config_path": str(cfg_path), "state": None},
        {"job_id": "job-2", "status": "failed", "config_path": str(cfg_path),
         "state": str(tmp_path / "gone-state")},
        {"job_id": "job-1", "status": "cancelled", "config_path": str(cfg_path),
         "state": str(good)},
    ]
    assert [e["job_id"] for e in history.resumable(entries)] == ["job-4"]
    cfg = history.resume_config(history.find(entries, "job-4"))
    assert cfg.training.resume == str(good)
    assert cfg.saving.output_dir == str(tmp_path / "out")


def test_a_stopped_run_outlives_the_server_and_resumes_from_its_state(tmp_path):
    from kohya_gui.runner import Runner
    from trainer.events import Checkpoint, Finished, Started

    out = tmp_path / "out"
    state = a_state(out / "run-step00000002-state", step=2)
    seen = []

    def fake_run(cfg, sink, control):
        seen.append(cfg)
        sink.emit(Started(total_steps=4, epochs=1, steps_per_epoch=4, num_images=1,
                          num_repeated_images=1, batch_size=1, gradient_accumulation_steps=1,
                          buckets={}, device="cpu", mixed_precision="no",
                          output_dir=str(out)))
        sink.emit(Checkpoint(step=2, epoch=1, path=str(out / "run.safetensors"),
                             state=str(state)))
        result = Finished("stopped", 2, output_path=str(out / "run.safetensors"))
        sink.emit(result)
        return result

    jobs = tmp_path / "jobs.json"
    cfg = TrainConfig(saving={"output_dir": str(out), "output_name": "run"})
    first = Runner(fake_run, history_path=jobs)
    first.submit(cfg)
    assert first.wait_idle(30)
    first.close()
    second = Runner(fake_run, history_path=jobs)  # the server restarted
    snap = second.snapshot()
    assert snap["history"][0]["status"] == "stopped"
    assert [r[1] for r in snap["resumable"]] == ["job-1"]
    assert "started" in second.resume("job-1")
    assert second.wait_idle(30)
    assert seen[-1].training.resume == str(state)
    assert second.snapshot()["history"][0]["job_id"] == "job-2"  # ids go on after the old ones
    assert "cannot be resumed" in second.resume("job-9")
    second.close()
