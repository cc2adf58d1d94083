"""The real app in headless Chromium (Playwright): choose the default LoRA preset, train, watch
the loss curve, reload and find it again, see "finished" and the output file; and a run that is
stopped from the page, with a second job queued and cancelled on the way."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gui_helpers import (  # noqa: F401
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    PAGE_TIMEOUT_MS,
    gui_home,
    launched,
    one_torch_thread,
)
from playwright.sync_api import Page, sync_playwright

from kohya_gui.app import build_app

pytestmark = pytest.mark.browser

CURVE_DRAWN = """() => {  // the raw and the smoothed loss (validation and a compared run: none)
  const paths = [...document.querySelectorAll('#loss-plot g.mark-line path')];
  return paths.filter(
    p => p.getAttribute('stroke') && (p.getAttribute('d') || '').includes('L')).length >= 2;
}"""
TRAIN_MINUTES = 4


@pytest.fixture(scope="module")
def app_url(gui_home):  # noqa: F811
    demo = build_app()
    yield launched(demo)
    demo.runner.close()
    demo.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(app_url)
    yield page
    context.close()


def text_input(page: Page, elem_id: str):
    return page.locator(f"#{elem_id} input, #{elem_id} textarea").first


def choose_default_preset(page: Page, output_dir: Path) -> None:
    page.click("#lora-preset input")
    page.get_by_role("option", name="default", exact=True).click()
    page.wait_for_function(
        "() => document.querySelector('#lora-file-msg').innerText.includes('Loaded preset')")
    assert text_input(page, "lora-saving-output_name").input_value() == "default-lora"
    text_input(page, "lora-saving-output_dir").fill(str(output_dir))


def status(page: Page) -> str:
    return page.get_attribute("#progress .ks-status", "data-status") or ""


def wait_status(page: Page, wanted: str, minutes: float = TRAIN_MINUTES) -> None:
    page.wait_for_selector(f'#progress .ks-status[data-status="{wanted}"]',
                           timeout=minutes * 60_000)


def test_train_watch_reload_and_finish(page, one_torch_thread, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    choose_default_preset(page, out)
    page.click("#lora-train")
    page.wait_for_function(
        "() => document.querySelector('#lora-train-msg').innerText.includes('started')")
    page.wait_for_function(CURVE_DRAWN, timeout=TRAIN_MINUTES * 60_000)
    reloaded, before = time.monotonic(), status(page)
    page.reload()
    page.wait_for_function(CURVE_DRAWN)
    print(f"curve back {time.monotonic() - reloaded:.1f}s after a reload ({before})")
    wait_status(page, "finished")
    expected = out / "default-lora.safetensors"
    page.wait_for_function(
        "() => { const e = document.querySelector('#output-path input, #output-path textarea');"
        " return e && e.value.endsWith('default-lora.safetensors'); }")
    assert text_input(page, "output-path").input_value() == str(expected)
    assert expected.is_file() and (out / "default-lora.toml").is_file()
    assert "60 / 60" in page.inner_text("#progress")
    log_lines = page.locator("#log-tail .ks-line").all_inner_texts()
    assert "finished at step 60" in log_lines[0]  # the newest line is the first one shown
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_function(CURVE_DRAWN)
    page.screenshot(path=str(ARTIFACTS / "gui_lora_page.png"), full_page=True)
    page.locator("#training-panel").screenshot(path=str(ARTIFACTS / "gui_lora_training.png"))


def test_stop_from_the_page_and_cancel_a_queued_job(page, one_torch_thread,  # noqa: F811
                                                    tmp_path):
    choose_default_preset(page, tmp_path / "long")
    # long enough to be running when the page cancels and stops: the preset's 2 epochs (60
    # steps) would win over max_train_steps alone, and end before the clicks on a fast machine
    text_input(page, "lora-training-max_train_epochs").fill("10000")
    text_input(page, "lora-training-max_train_steps").fill("100000")
    # every answer below waits behind a run that takes the CPU (and, in a long test process,
    # Python's full garbage collections): in CI the page answered in over 30 s
    page.set_default_timeout(TRAIN_MINUTES * 60_000)
    page.click("#lora-train")
    page.wait_for_function(
        "() => document.querySelector('#lora-train-msg').innerText.includes('started')")
    page.click("#lora-train")  # the same settings again: it has to wait
    page.wait_for_function(  # the answer waits for the page's queue while a run takes the CPU
        "() => document.querySelector('#lora-train-msg').innerText.includes('queued')")
    page.wait_for_function(
        "() => document.querySelector('#queue-table').innerText.includes('queued #1')")
    page.wait_for_function(CURVE_DRAWN, timeout=TRAIN_MINUTES * 60_000)
    page.wait_for_function(  # the timer preselects the first queued job
        "() => document.querySelector('#cancel-choice input').value.startsWith('job-')")
    page.click("#cancel")
    page.wait_for_function(
        "() => document.querySelector('#queue-msg').innerText.includes('cancelled')")
    page.click("#stop")
    page.wait_for_function(
        "() => document.querySelector('#stop-msg').innerText.includes('stopping')")
    wait_status(page, "stopped", minutes=2)
    assert "Stopped" in page.inner_text("#progress")
    saved = text_input(page, "output-path")
    page.wait_for_function(
        "() => document.querySelector('#output-path input, #output-path textarea').value")
    assert Path(saved.input_value()).is_file()
    table = page.inner_text("#queue-table")
    assert "cancelled" in table and "queued #" not in table
