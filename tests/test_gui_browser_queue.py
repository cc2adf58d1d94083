"""A busy queue in two tabs (issue 22): 10 jobs queued, one tab cancels a waiting job, the other
is reloaded and stops the running one, while the rest run. Every job ends in the state asked
(stopped, cancelled, or finished), they start in the order they were queued, both tabs show the
same run, and the history holds all ten."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gui_helpers import CHROMIUM, CHROMIUM_ARGS, PAGE_TIMEOUT_MS, gui_home, launched  # noqa: F401
from playwright.sync_api import sync_playwright

from kohya_gui.app import build_app
from kohya_gui.runner import Runner
from trainer.config import files as config_io
from trainer.events import Finished, Started, Step

pytestmark = pytest.mark.browser
LONG, CANCEL = "q03", "q06"


def queue_run(started: list[str]):
    def run(cfg, sink, control) -> Finished:
        name = cfg.saving.output_name
        started.append(name)
        steps = 100_000 if name == LONG else 4
        sink.emit(Started(total_steps=steps, epochs=1, steps_per_epoch=steps, num_images=1,
                          num_repeated_images=1, batch_size=1, gradient_accumulation_steps=1,
                          buckets={"64x64": 1}, device="CPU", mixed_precision="no",
                          output_dir=cfg.saving.output_dir))
        deadline = time.monotonic() + 120
        for step in range(1, steps + 1):
            time.sleep(0.1)
            sink.emit(Step(step=step, total_steps=steps, epoch=1, loss=1.0 / step, loss_avg=1.0,
                           lr=1e-4, it_per_s=10.0, eta_s=1.0))
            if control.stop_requested or time.monotonic() > deadline:
                result = Finished("stopped", step)
                sink.emit(result)
                return result
        result = Finished("finished", steps)
        sink.emit(result)
        return result

    return run


def wait_status(page, job: str, status: str, timeout: float = 60_000) -> None:
    page.wait_for_function(
        """([job, status]) => {
          const el = document.querySelector('#progress .ks-status');
          return el && el.dataset.status === status && el.innerText.includes(job);
        }""", arg=[job, status], timeout=timeout)


def test_ten_jobs_two_tabs_reload_stop_and_cancel(gui_home, tmp_path):  # noqa: F811
    started: list[str] = []
    runner = Runner(queue_run(started), write_config=False,
                    history_path=Path(tmp_path) / "jobs.json")
    demo = build_app(runner)
    url = launched(demo)
    names = [f"q{i:02d}" for i in range(1, 11)]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            one, two = (browser.new_context(viewport={"width": 1400, "height": 1000}
                                            ).new_page() for _ in range(2))
            for tab in (one, two):
                tab.set_default_timeout(PAGE_TIMEOUT_MS)
                tab.goto(url)
                tab.wait_for_selector("#training-panel")
            ids = {}
            for name in names:
                cfg = config_io.from_dict({"saving": {"output_dir": str(tmp_path / name),
                                                      "output_name": name}})
                ids[name] = runner.submit(cfg, label=name)["job_id"]
            wait_status(one, ids[LONG], "running")
            wait_status(two, ids[LONG], "running")  # both tabs show the same run
            two.click("#cancel-choice input")
            two.get_by_role("option", name=ids[CANCEL], exact=True).click()
            two.click("#cancel")
            two.wait_for_function(
                "() => document.querySelector('#queue-msg')?.innerText.includes('cancelled')")
            one.reload()
            one.wait_for_selector("#training-panel")
            wait_status(one, ids[LONG], "running")
            one.click("#stop")
            assert runner.wait_idle(120)
            for tab in (one, two):
                tab.wait_for_function(
                    "() => document.querySelector('#queue-table')?.innerText.includes('q10')")
            browser.close()
        expected = {n: "finished" for n in names} | {LONG: "stopped", CANCEL: "cancelled"}
        history = {h["label"]: h["status"] for h in runner.snapshot()["history"]}
        assert history == expected
        assert started == [n for n in names if n != CANCEL]  # the queue's order held
        numbers = [int(ids[n].split("-")[1]) for n in names]
        assert numbers == sorted(numbers)
        reread = Runner(queue_run([]), write_config=False,
                        history_path=Path(tmp_path) / "jobs.json")
        assert {h["label"]: h["status"] for h in reread.snapshot()["history"]} == expected
        reread.close()
    finally:
        runner.close()
        demo.close()
