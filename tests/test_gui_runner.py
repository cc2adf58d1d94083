"""The runner: one job at a time, a queue behind it, cancel, stop, and the state snapshot the
page polls; with a fake trainer (fast) and once with the real one on the default preset."""

from __future__ import annotations

import threading

import pytest
from gui_helpers import (  # noqa: F401
    CLASS_IMAGES,
    DEFAULT_PRESET,
    QUICK_STEPS,
    fake_run,
    gui_home,
    one_torch_thread,
    quick_overrides,
    wait_for,
)

from kohya_gui import progress
from kohya_gui.runner import JobState, QueueFull, Runner, smooth
from trainer.config import TrainConfig
from trainer.config import files as config_io
from trainer.events import Progress, Started, Step


def cfg_in(tmp_path, name: str = "job") -> TrainConfig:
    return config_io.from_dict({"saving": {"output_dir": str(tmp_path / name),
                                           "output_name": name}})


@pytest.fixture
def runners():
    made: list[Runner] = []

    def make(*args, **kwargs) -> Runner:
        made.append(Runner(*args, **kwargs))
        return made[-1]

    yield make
    for runner in made:
        runner.close()


def test_a_job_runs_and_the_snapshot_tells_all(runners, tmp_path):
    runner = runners(fake_run(steps=10))
    answer = runner.submit(cfg_in(tmp_path))
    assert answer["status"] == "running" and answer["job_id"] == "job-1"
    assert runner.wait_idle(60)
    snap = runner.snapshot()
    assert snap["status"] == "finished" and snap["step"] == snap["total"] == 10
    assert [p[0] for p in snap["loss"]] == list(range(1, 11))
    assert len(snap["smoothed"]) == 10 and snap["lr"] == 1e-4 and snap["it_per_s"] == 10.0
    assert snap["output_path"].endswith("job.safetensors") and snap["error"] is None
    assert snap["checkpoints"] == [snap["output_path"]]
    assert any("finished at step 10" in line for line in snap["log"])
    assert snap["started"]["buckets"] == {"64x64": 6}
    entry = snap["history"][0]
    assert {k: entry[k] for k in ("job_id", "label", "status", "output_path")} == {
        "job_id": "job-1", "label": "lora: job", "status": "finished",
        "output_path": snap["output_path"]}
    assert entry["smoothed"] == snap["smoothed"] and entry["validation"] == []  # to compare
    written = config_io.load(snap["config_path"])  # the resolved config beside the outputs
    assert written.saving.output_name == "job" and snap["config_path"].endswith("job.toml")


def test_a_second_job_is_queued_and_can_be_cancelled(runners, tmp_path):
    gate = threading.Event()
    run = fake_run(steps=4, gate=gate)
    runner = runners(run)
    first = runner.submit(cfg_in(tmp_path, "a"))
    second = runner.submit(cfg_in(tmp_path, "b"))
    third = runner.submit(cfg_in(tmp_path, "c"))
    assert first["status"] == "running"
    assert second["status"] == "queued" and second["position"] == 1
    assert third["position"] == 2 and "queued (position 2)" in third["message"]
    wait_for(lambda: runner.snapshot()["job_id"] == "job-1")
    snap = runner.snapshot()
    assert snap["status"] == "running"
    assert [q["job_id"] for q in snap["queue"]] == ["job-2", "job-3"]
    assert progress.queue_rows(snap)[:3] == [["job-1", "running", "lora: a"],
                                             ["job-2", "queued #1", "lora: b"],
                                             ["job-3", "queued #2", "lora: c"]]
    assert runner.cancel("job-2") == "job-2 cancelled"
    assert "use Stop" in runner.cancel("job-1")
    assert "not in the queue" in runner.cancel("job-2")
    gate.set()
    assert runner.wait_idle(60)
    snap = runner.snapshot()
    assert snap["job_id"] == "job-3" and snap["status"] == "finished"
    assert [c.saving.output_name for c in run.calls] == ["a", "c"]
    assert {h["job_id"]: h["status"] for h in snap["history"]} == {
        "job-1": "finished", "job-2": "cancelled", "job-3": "finished"}


def test_the_queue_is_small(runners, tmp_path):
    gate = threading.Event()
    runner = runners(fake_run(steps=2, gate=gate), max_queue=2)
    runner.submit(cfg_in(tmp_path))
    wait_for(lambda: runner.snapshot()["status"] == "running" and not runner.snapshot()["queue"])
    runner.submit(cfg_in(tmp_path))
    runner.submit(cfg_in(tmp_path))
    with pytest.raises(QueueFull):
        runner.submit(cfg_in(tmp_path))
    gate.set()
    assert runner.wait_idle(60)


def test_stop_ends_the_run_at_a_step_boundary(runners, tmp_path):
    runner = runners(fake_run(steps=10_000, delay=0.005))
    runner.submit(cfg_in(tmp_path))
    wait_for(lambda: runner.snapshot()["step"] >= 3)
    assert "stopping job-1" in runner.stop()
    assert runner.snapshot()["stop_requested"] is True
    assert runner.wait_idle(60)
    snap = runner.snapshot()
    assert snap["status"] == "stopped" and 3 <= snap["step"] < 10_000
    assert snap["output_path"].endswith(".safetensors")
    assert runner.stop() == "nothing is running"


def test_failures_are_reported_in_plain_words(runners, tmp_path):
    runner = runners(fake_run(steps=10, fail="the dataset folder is empty"))
    runner.submit(cfg_in(tmp_path))
    assert runner.wait_idle(60)
    snap = runner.snapshot()
    assert snap["status"] == "failed" and snap["error"] == "the dataset folder is empty"
    assert progress.error_markdown(snap) == "**Training failed:** the dataset folder is empty"

    def crash(cfg, sink, control):
        raise RuntimeError("out of memory on the device")

    crashing = runners(crash)
    crashing.submit(cfg_in(tmp_path))
    assert crashing.wait_idle(60)
    assert crashing.snapshot()["error"] == "out of memory on the device"
    blocked = tmp_path / "file"
    blocked.write_text("x")
    unwritable = runners(fake_run())
    unwritable.submit(config_io.from_dict({"saving": {"output_dir": str(blocked / "sub")}}))
    assert unwritable.wait_idle(60)
    snap = unwritable.snapshot()
    assert snap["status"] == "failed" and "cannot write the config" in snap["error"]


def test_class_images_progress_shows_until_training_starts(runners, tmp_path):
    gate = threading.Event()
    runner = runners(fake_run(steps=4, gate=gate, prepare=25))
    runner.submit(cfg_in(tmp_path))
    wait_for(lambda: (runner.snapshot()["preparing"] or {}).get("done") == 25)
    snap = runner.snapshot()
    assert snap["status"] == "running" and snap["step"] == snap["total"] == 0
    assert snap["preparing"] == {"stage": CLASS_IMAGES, "done": 25, "total": 25}
    html = progress.progress_html(snap)
    assert "Generating class images 25/25" in html and 'max="25" value="25"' in html
    noted = [line for line in snap["log"] if CLASS_IMAGES in line]
    assert 2 <= len(noted) <= 11, noted  # now and then, not one line per image
    assert noted[0].endswith(f"{CLASS_IMAGES}: 1/25")
    assert noted[-1].endswith(f"{CLASS_IMAGES}: 25/25")
    gate.set()
    assert runner.wait_idle(60)
    snap = runner.snapshot()
    assert snap["status"] == "finished" and snap["preparing"] is None
    assert "Generating class images" not in progress.progress_html(snap)


def test_a_preparation_stage_in_the_progress_line(tmp_path):
    from kohya_gui.runner import IDLE, Job

    assert IDLE["preparing"] is None
    state = JobState(Job("job-1", cfg_in(tmp_path), "dreambooth: job"))
    for done in range(1, 1001):
        state.apply(Progress(CLASS_IMAGES, done, 1000))
        if done == 3:
            three = {**state.to_dict(), "queue": [], "history": [], "version": 1}
    assert "Generating class images 3/1000" in progress.progress_html(three)
    assert 'max="1000" value="3"' in progress.progress_html(three)
    assert len(state.log) == 11  # the first event, each tenth: 1, 100, 200, ..., 1000
    state.apply(Progress("Caching latents", 1, 2))  # a new stage gets its own first line
    assert state.log[-1].endswith("Caching latents: 1/2")
    state.apply(Started(total_steps=8, epochs=1, steps_per_epoch=8, num_images=2,
                        num_repeated_images=4, batch_size=1, gradient_accumulation_steps=1,
                        buckets={"64x64": 4}, device="CPU", mixed_precision="no",
                        output_dir=str(tmp_path)))
    snap = {**state.to_dict(), "queue": [], "history": [], "version": 2}
    assert snap["preparing"] is None and progress.preparing_line(snap) == ""
    html = progress.progress_html(snap)
    assert "0 / 8" in html and 'max="8" value="0"' in html


def test_smoothing_is_a_debiased_moving_average():
    ema, first = smooth(0.0, 2.0, 1)
    assert first == pytest.approx(2.0)  # no pull towards zero at the start
    ema, second = smooth(ema, 1.0, 2)
    assert second == pytest.approx((0.9 * 0.1 * 2 + 0.1 * 1) / (1 - 0.81))


def test_views_of_the_snapshot(tmp_path):
    from kohya_gui.runner import Job

    state = JobState(Job("job-1", cfg_in(tmp_path), "lora: job"))
    for step in range(1, 1501):
        state.apply(Step(step, 1500, 1, 1.0 / step, 1.0, 1e-4, 5.0, 10.0))
        state.note(f"line {step}")
    snap = {**state.to_dict(), "queue": [], "history": [], "version": 1}
    frame = progress.loss_frame(snap)
    assert list(frame.columns) == ["step", "loss", "series"]
    assert set(frame["series"]) == set(progress.SERIES)  # each series has its colour row
    assert len(frame.dropna()) == 2 * progress.MAX_POINTS and frame["step"].max() == 1500
    empty = progress.loss_frame({"loss": [], "smoothed": []})
    assert set(empty["series"]) == set(progress.SERIES) and empty["loss"].isna().all()
    assert progress.x_limit(snap) == [0, 1500]
    html = progress.log_html(snap)
    assert html.index("line 1500") < html.index("line 1499")  # newest first
    assert "1500 / 1500" in progress.progress_html(snap) and "0:10" in progress.progress_html(snap)
    assert progress.duration(3725) == "1:02:05"


def test_the_real_trainer_through_the_runner(runners, gui_home, one_torch_thread,  # noqa: F811
                                            tmp_path):
    cfg = config_io.load(DEFAULT_PRESET, quick_overrides(tmp_path / "out"))
    runner = runners()
    runner.submit(cfg)
    assert runner.wait_idle(300)
    snap = runner.snapshot()
    assert snap["status"] == "finished", snap["error"]
    assert snap["step"] == snap["total"] == QUICK_STEPS and len(snap["loss"]) == QUICK_STEPS
    assert snap["output_path"] and (tmp_path / "out" / "default-lora.safetensors").exists()
    assert snap["started"]["num_images"] > 0


def test_the_page_gets_only_what_changed(tmp_path):
    from kohya_gui.panel import render

    parts = {k: k for k in ("progress", "log", "output", "error", "plot", "queue",
                            "cancel_choice", "gallery", "compare", "resume_choice", "seen")}
    inside = tmp_path / "out" / "sample" / "s.png"
    snap = {"status": "finished", "job_id": "job-1", "label": "lora: x", "step": 2, "total": 2,
            "epoch": 1, "epochs": 1, "loss": [[1, 1.0], [2, 0.5]],
            "smoothed": [[1, 1.0], [2, 0.7]],
            "lr": 1e-4, "it_per_s": 1.0, "eta_s": 0, "log": ["a"], "output_path": "o",
            "error": None, "output_dir": str(tmp_path / "out"), "started": {},
            "samples": [{"step": 2, "paths": [str(inside), "/etc/passwd"],
                         "prompts": ["p", "q"]}],
            "queue": [], "history": [], "version": 7, "stop_requested": False, "elapsed_s": 3}
    first = render(snap, {}, parts)
    assert set(first) == set(parts)
    gallery = first["gallery"].value  # only files inside the run's output folder are shown
    assert len(gallery) == 1 and str(inside) in str(gallery) and "passwd" not in str(gallery)
    # the curve: an SVG with the raw and the smoothed loss, sent again only when it changed
    assert first["plot"].startswith("<svg") and first["plot"].count('class="mark-line"') == 2
    second = render({**snap, "version": 8}, first["seen"], parts)
    assert "plot" not in second and "log" in second
    assert render({**snap, "version": 8}, second["seen"], parts) == {"seen": second["seen"]}
    assert first["error"].visible is False
    failed = {**snap, "status": "failed", "error": "no images in the folder", "version": 9}
    shown = render(failed, second["seen"], parts)
    assert shown["error"].visible is True and "no images in the folder" in shown["error"].value
    assert 'data-status="failed"' in shown["progress"]


def test_an_edit_sample_is_drawn_beside_its_controls(tmp_path):
    """A Sample's controls (its prompt's --ci) are drawn on the left of the sample at its
    height; a sample without one, or whose control does not decode, is the file itself; only
    samples inside the output folder are shown."""
    from PIL import Image

    from kohya_gui.sample_gallery import GAP, gallery_items

    out = tmp_path / "out"
    (out / "sample").mkdir(parents=True)
    Image.new("RGB", (64, 32), (0, 0, 255)).save(out / "sample" / "a.png")
    Image.new("RGB", (64, 32), (0, 255, 0)).save(out / "sample" / "b.png")
    control = tmp_path / "ctl.png"
    Image.new("RGB", (16, 16), (255, 0, 0)).save(control)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    snap = {"output_dir": str(out), "samples": [
        {"step": 1, "paths": [str(out / "sample" / "b.png")], "prompts": ["old"]},
        {"step": 2, "paths": [str(out / "sample" / "a.png"), str(out / "sample" / "b.png"),
                              "/etc/passwd"],
         "prompts": ["add a circle", "plain", "x"],
         "controls": [[str(control), str(control)], [str(broken)], [str(control)]]}]}
    items = gallery_items(snap)
    assert [caption for _, caption in items] == [
        "step 2: add a circle (left: its control)", "step 2: plain", "step 1: old"]
    pair = items[0][0]
    assert pair.size == (2 * (32 + GAP) + 64, 32)  # two 32x32 controls, then the sample
    assert pair.getpixel((5, 5)) == (255, 0, 0) and pair.getpixel((2 * (32 + GAP) + 5, 5)) == (
        0, 0, 255)
    assert items[1][0] == str(out / "sample" / "b.png")  # its control does not decode
    assert len(gallery_items(snap, limit=1)) == 1
