"""The GUI's own process dies (issue 22): killed with SIGKILL during a run, the training
children (torchrun and its ranks) end too; the next start lists the run as "interrupted" with
its last saved state and Resume continues it from there to the end; no file is left
half-written; and a second studio process on the same data folder refuses to start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from gui_helpers import PROJECT, free_port, wait_for

from kohya_gui import history

pytestmark = pytest.mark.slow


def start_gui(home: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "KOHYA_STUDIO_HOME": str(home), "OMP_NUM_THREADS": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("GRADIO_TEMP_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "kohya_gui", "--port", str(port)],
                            cwd=PROJECT, env=env, stdout=log.open("a"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=120, every=0.5)
    return proc, url


def call(url: str, name: str, *data) -> object:
    """A Gradio API call (POST, then read the result stream)."""
    event = httpx.post(f"{url}gradio_api/call/{name}", json={"data": list(data)}, timeout=30)
    assert event.status_code == 200, event.text
    event_id = event.json()["event_id"]
    with httpx.stream("GET", f"{url}gradio_api/call/{name}/{event_id}", timeout=120) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    return json.loads(lines[-1][5:])[0]


def state(url: str) -> dict:
    return call(url, "state")


def job_toml(out: Path) -> str:
    preset = (PROJECT / "presets" / "lora" / "default.toml").read_text()
    return preset.replace('output_dir = "output/default-lora"',
                          f"output_dir = {json.dumps(str(out))}")


def overrides(steps: int, processes: int = 1) -> list[str]:
    return [f"training.max_train_steps={steps}", "training.max_train_epochs=1000",
            "saving.save_every_n_steps=4", "saving.save_state=true",
            f"training.num_processes={processes}", "dataset.resolution=64",
            "dataset.min_bucket_reso=64", "dataset.max_bucket_reso=64"]


def test_killed_gui_leaves_an_interrupted_run_that_resumes(tmp_path):
    home, out, log = tmp_path / "home", tmp_path / "out", tmp_path / "gui.log"
    proc, url = start_gui(home, log)
    try:
        answer = call(url, "train_toml", job_toml(out), overrides(400))
        assert answer["ok"], answer
        jobs = home / "jobs.json"

        def saved_state():
            entries = json.loads(jobs.read_text()) if jobs.is_file() else []
            return next((e for e in entries if e["status"] == "running" and e.get("state")),
                        None)

        running = wait_for(saved_state, timeout=300, every=0.5)
        assert running["config_path"] and Path(running["config_path"]).is_file()
    finally:
        proc.kill()  # SIGKILL: nothing of the GUI runs after this
        proc.wait(30)
    saved = Path(running["state"])
    # no file half-written: the history, the config copy and every saved file read back
    entries = json.loads((home / "jobs.json").read_text())
    assert entries[0]["job_id"] == running["job_id"]
    from safetensors import safe_open

    from trainer.run.state import read_progress

    for path in out.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            assert list(f.keys())
    progress = read_progress(saved)
    assert progress is not None
    proc, url = start_gui(home, log)
    try:
        snap = state(url)
        past = next(h for h in snap["history"] if h["job_id"] == running["job_id"])
        assert past["status"] == "interrupted" and past["state"] == running["state"]
        assert any(r[1] == running["job_id"] for r in snap["resumable"])
        message = call(url, "resume", running["job_id"])
        assert "continues" in message, message
        wait_for(lambda: state(url)["status"] in ("finished", "failed", "stopped"),
                 timeout=600, every=1.0)
        snap = state(url)
        assert snap["status"] == "finished", snap.get("error")
        assert snap["step"] == 400
        first_step = snap["loss"][0][0]
        assert first_step == progress_step(saved) + 1  # continued, not started again
        assert snap["job_id"] != running["job_id"] and "(resumed)" in snap["label"]
    finally:
        proc.terminate()
        proc.wait(60)


def progress_step(state_folder: Path) -> int:
    from trainer.run.state import read_progress

    progress = read_progress(state_folder)
    return int(getattr(progress, "step", None) or progress["step"])


def test_killed_gui_takes_its_training_processes_with_it(tmp_path):
    home, out, log = tmp_path / "home", tmp_path / "out", tmp_path / "gui.log"
    proc, url = start_gui(home, log)
    children: list[psutil.Process] = []
    try:
        answer = call(url, "train_toml", job_toml(out), overrides(2000, 2))
        assert answer["ok"], answer

        def ranks():
            found = psutil.Process(proc.pid).children(recursive=True)
            workers = [p for p in found if "trainer.run.launch" in " ".join(p.cmdline())
                       or "torchrun" in " ".join(p.cmdline())]
            return found if len(workers) >= 3 else None  # torchrun and two ranks

        children = wait_for(ranks, timeout=240, every=0.5)
        wait_for(lambda: state(url)["step"] >= 1, timeout=300, every=1.0)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    gone, alive = psutil.wait_procs(children, timeout=90)
    assert alive == [], [(p.pid, p.cmdline()) for p in alive]
    entries = json.loads((home / "jobs.json").read_text())
    assert entries[0]["status"] == "running"  # and the next start calls it interrupted
    assert history.load_history(home / "jobs.json")[0]["status"] == "interrupted"


def test_a_second_gui_on_the_same_data_folder_refuses(tmp_path):
    home, log = tmp_path / "home", tmp_path / "gui.log"
    proc, url = start_gui(home, log)
    try:
        second = subprocess.run(
            [sys.executable, "-m", "kohya_gui", "--port", str(free_port())], cwd=PROJECT,
            env={**os.environ, "KOHYA_STUDIO_HOME": str(home)}, capture_output=True,
            text=True, timeout=120)
        assert second.returncode == 2
        assert f"another Kohya Studio (pid {proc.pid})" in second.stderr
        assert "KOHYA_STUDIO_HOME" in second.stderr and "Traceback" not in second.stderr
        assert state(url)["status"] == "idle"  # the first one is untouched
    finally:
        proc.kill()
        proc.wait(30)
    started = time.monotonic()  # the kernel freed the lock with the process
    history.lock(home / "jobs.json")
    history.unlock(home / "jobs.json")
    assert time.monotonic() - started < 5
