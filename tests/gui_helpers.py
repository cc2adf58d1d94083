"""Shared fixtures and fakes of the GUI tests (imported by tests/test_gui_*.py).

``gui_home`` makes sure KOHYA_STUDIO_HOME is a temporary folder for the whole session (the
embedded model and sample dataset are built there once). ``fake_run`` stands in for
``trainer.run.loop.run``: it emits the same events, honours Control, and writes a small file.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from trainer.events import Checkpoint, Control, Finished, Log, Progress, Started, Step

PROJECT = Path(__file__).resolve().parent.parent
DEFAULT_PRESET = PROJECT / "presets" / "lora" / "default.toml"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = PROJECT / "tests" / "artifacts"
# The browser tests' limit for a wait: every wait is for a condition of the page, so the limit
# only bounds how long a failure takes to show; a machine whose other core is busy redraws the
# form slowly (a search's redraw of every field missed a 30 s limit once)
PAGE_TIMEOUT_MS = 90_000
# The real trainer on the default preset, cut short so that the suite stays fast.
QUICK_STEPS = 6
CLASS_IMAGES = "Generating class images"  # trainer.run.class_images.STAGE, without torch


@pytest.fixture(scope="session")
def gui_home(tmp_path_factory: pytest.TempPathFactory):
    """KOHYA_STUDIO_HOME inside pytest's temporary folder for the session: the one a conftest
    already set up there, else a new one (never the user's data folder)."""
    base = tmp_path_factory.getbasetemp().resolve()
    current = os.environ.get("KOHYA_STUDIO_HOME")
    with pytest.MonkeyPatch.context() as mp:
        if current and Path(current).resolve().is_relative_to(base):
            home = Path(current)
        else:
            home = tmp_path_factory.mktemp("gui_home")
            mp.setenv("KOHYA_STUDIO_HOME", str(home))
        mp.setenv("GRADIO_ANALYTICS_ENABLED", "False")
        mp.delenv("GRADIO_TEMP_DIR", raising=False)
        yield home


@pytest.fixture
def one_torch_thread():
    """The real trainer with one intra-op thread while the test runs. On a shared 2-core
    machine torch's default threads oversubscribe the CPU: the tiny model then takes seconds
    per step instead of a few steps per second (measured 0.2 vs 24 steps/s under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fake_run(steps: int = 12, delay: float = 0.0, fail: str | None = None,
             gate: threading.Event | None = None, prepare: int = 0) -> Callable[..., Finished]:
    """A stand-in for trainer.run.loop.run: ``prepare`` Progress events (class images, one each),
    then (after ``gate``) Started, Step per step, a Checkpoint, Finished."""
    calls: list[Any] = []

    def run(cfg, sink, control: Control) -> Finished:
        calls.append(cfg)
        out = Path(cfg.saving.output_dir)
        sink.emit(Log("fake trainer starting"))
        for done in range(1, prepare + 1):
            sink.emit(Progress(CLASS_IMAGES, done, prepare))
        if gate is not None:
            gate.wait(30)
        sink.emit(Started(total_steps=steps, epochs=2, steps_per_epoch=steps // 2, num_images=3,
                          num_repeated_images=6, batch_size=1, gradient_accumulation_steps=1,
                          buckets={"64x64": 6}, device="CPU", mixed_precision="no",
                          output_dir=str(out)))
        for step in range(1, steps + 1):
            if fail and step == steps // 2:
                sink.emit(Finished("failed", step, error=fail))
                return Finished("failed", step, error=fail)
            time.sleep(delay)
            sink.emit(Step(step=step, total_steps=steps, epoch=1 + (step - 1) * 2 // steps,
                           loss=1.0 / step, loss_avg=1.0, lr=1e-4, it_per_s=10.0,
                           eta_s=(steps - step) / 10))
            if control.stop_requested:
                return _save(sink, out, cfg, step, "stopped")
        return _save(sink, out, cfg, steps, "finished")

    run.calls = calls  # type: ignore[attr-defined]
    return run


def _save(sink, out: Path, cfg, step: int, status: str) -> Finished:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{cfg.saving.output_name}.safetensors"
    path.write_bytes(b"fake")
    sink.emit(Checkpoint(step=step, epoch=1, path=str(path)))
    result = Finished(status, step, output_path=str(path))
    sink.emit(result)
    return result


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")


def quick_overrides(output_dir: Path, steps: int = QUICK_STEPS) -> list[str]:
    return [f"saving.output_dir={json.dumps(str(output_dir))}", f"training.max_train_steps={steps}"]


def launched(demo, **kwargs) -> str:
    """Launch ``demo`` in this process on a free port; returns its URL."""
    from kohya_gui.app import launch

    port = free_port()
    launch(demo, port=port, prevent_thread_lock=True, quiet=True, **kwargs)
    return f"http://127.0.0.1:{port}/"


def chromium_ready() -> bool:
    return os.path.exists(CHROMIUM)


@contextmanager
def studio_process(folder: Path, env: dict[str, str] | None = None,
                   args: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen, str]]:
    """``python -m kohya_gui --port N`` started in ``folder`` (its output in folder/gui.log),
    yielded with its URL once the page answers; terminated after the block."""
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "kohya_gui", "--port", str(port), *args]
    log_path = folder / "gui.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/"

            def up() -> bool:
                assert proc.poll() is None, log_path.read_text()
                try:
                    return httpx.get(url, timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, timeout=90, every=0.5)
            yield proc, url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def sample_control(index: int = 0) -> Path:
    """The embedded sample dataset's control of its ``index``-th picture (written on demand
    in the studio's data home, as a run on the sample dataset writes it)."""
    from trainer.config.paths import data_home
    from trainer.data.sample import EMBEDDED_DATASET, SAMPLE_CONTROLS, resolve_dataset_dir

    resolve_dataset_dir(EMBEDDED_DATASET, data_home())
    folder = data_home() / "embedded" / SAMPLE_CONTROLS
    return sorted(folder.rglob("*.png"))[index]
