"""Text from strangers is shown as text (issue 22), in the real page in headless Chromium: a LoRA
whose metadata holds markup, script, a megabyte of tags and invalid JSON, inspected in the
Utilities tab; file names and captions with markup in the caption editor and the dataset check;
a run whose label, log, sample prompts, sample file names and error hold markup, in the panel,
the queue and the history. Nothing executes (no dialog opens), no element of the file's appears
in the page, the markup is there as characters, and long values end in "...". """

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gui_helpers import (  # noqa: F401
    CHROMIUM,
    CHROMIUM_ARGS,
    PAGE_TIMEOUT_MS,
    gui_home,
    launched,
    wait_for,
)
from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright
from safetensors.torch import save_file

from kohya_gui.app import build_app
from kohya_gui.runner import Runner
from trainer.config import files as config_io
from trainer.events import Finished, Log, Sample, Started, Step

pytestmark = pytest.mark.browser

SCRIPT = "<img src=x onerror=alert(1) data-x=1><b id=x-injected>bold</b><script>alert(2)</script>"
MARKDOWN = "[link](javascript:alert(3)) ![pic](x) **strong** $$x$$ http://evil.example/y"
PAYLOAD = SCRIPT + " " + MARKDOWN
NAME = "<img src=x onerror=alert(4) data-x=1>[link](javascript:alert(5))"  # no '/' in a name
INJECTED = """() => {
  const found = [...document.querySelectorAll(
    '[data-x], #x-injected, img[alt="pic"], img[src="x"], a[href^="javascript"], '
    + 'a[href*="evil.example"], .katex')];
  const links = [...document.querySelectorAll('a')].filter(a => a.textContent === 'link');
  const scripts = [...document.querySelectorAll('script')].filter(
    s => (s.textContent || '').includes('alert('));
  return found.length + links.length + scripts.length;
}"""


def lora_with_markup(path: Path) -> Path:
    tags = {f"tag{i:06d}": i for i in range(60_000)}  # about 1 MB of JSON
    tags[SCRIPT + "x" * 5000] = 10**9  # the most frequent tag: long, and markup
    meta = {"ss_output_name": PAYLOAD, "ss_training_comment": PAYLOAD + "y" * 100_000,
            "ss_tag_frequency": json.dumps({"1_" + SCRIPT: tags}),
            "ss_network_module": "lycoris.kohya", "ss_network_args": "{not json " + SCRIPT,
            "ss_dataset_dirs": "[[[[" * 50_000, "modelspec.title": "\x1b[31m" + PAYLOAD,
            SCRIPT: PAYLOAD}
    name = "lora_unet_down_blocks_0_attentions_0_proj_in"
    save_file({f"{name}.lora_down.weight": torch.randn(4, 8),
               f"{name}.lora_up.weight": torch.randn(8, 4), f"{name}.alpha": torch.tensor(4.0),
               f"{SCRIPT}.weight": torch.zeros(2)}, str(path), metadata=meta)
    assert len(meta["ss_tag_frequency"]) > 1_000_000
    return path


def markup_run(cfg, sink, control) -> Finished:
    out = Path(cfg.saving.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    image = out / f"{NAME}.png"
    Image.new("RGB", (32, 32), (200, 20, 20)).save(image)
    sink.emit(Log(PAYLOAD))
    sink.emit(Log("x" * 50_000))
    sink.emit(Started(total_steps=4, epochs=1, steps_per_epoch=4, num_images=1,
                      num_repeated_images=1, batch_size=1, gradient_accumulation_steps=1,
                      buckets={"64x64": 1}, device="CPU", mixed_precision="no",
                      output_dir=str(out)))
    for step in (1, 2):
        sink.emit(Step(step=step, total_steps=4, epoch=1, loss=0.5, loss_avg=0.5, lr=1e-4,
                       it_per_s=1.0, eta_s=1.0))
    sink.emit(Sample(step=2, paths=(str(image),), prompts=(PAYLOAD,)))
    result = Finished("failed", 2, error=f"{NAME}: {PAYLOAD}")
    sink.emit(result)
    return result


@pytest.fixture(scope="module")
def app(gui_home, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("strangers")
    history = root / "jobs.json"
    history.write_text(json.dumps([{"job_id": "job-1", "label": PAYLOAD, "status": "failed",
                                    "output_path": None, "smoothed": [[1, 0.5], [2, 0.4]],
                                    "validation": []}]))
    runner = Runner(markup_run, write_config=False, history_path=history)
    demo = build_app(runner)
    url = launched(demo)
    yield demo, url, root
    demo.runner.close()
    demo.close()


@pytest.fixture
def page(app):
    _, url, _ = app
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(url)
        page.wait_for_selector("#training-panel")
        page.dialogs = dialogs
        yield page
        assert dialogs == [], dialogs
        browser.close()


def field(page, elem_id: str):
    return page.locator(f"#{elem_id} input, #{elem_id} textarea").first


def no_injection(page) -> None:
    # every image loaded or failed, so an injected image's onerror has had its chance to run
    page.wait_for_function("() => [...document.images].every(i => i.complete)")
    assert page.evaluate(INJECTED) == 0
    assert page.dialogs == []


def test_inspect_shows_markup_as_text(page, app):
    _, _, root = app
    path = lora_with_markup(root / "markup.safetensors")
    page.get_by_role("tab", name="Utilities", exact=True).click()
    field(page, "inspect-path").fill(str(path))
    page.click("#inspect-run")
    page.wait_for_function(
        "() => document.querySelector('#inspect-report')?.innerText.includes('Modules:')")
    report = page.inner_text("#inspect-report")
    assert "<img src=x onerror=alert(1) data-x=1>" in report
    assert "[link](javascript:alert(3))" in report and "**strong**" in report
    assert "LyCORIS" in report and "tag000000" not in report[:200]
    assert "..." in report and len(report) < 20_000
    assert "\x1b" not in report
    page.get_by_text("All metadata", exact=True).click()
    page.wait_for_function(
        "() => document.querySelector('#inspect-metadata')?.innerText.includes('onerror')")
    meta = page.inner_text("#inspect-metadata")
    assert "onerror=alert(1)" in meta and len(meta) < 60_000
    no_injection(page)


def test_a_file_that_cannot_be_read_gives_one_error_and_the_tab_still_works(page, app):
    _, _, root = app
    bad = root / f"{NAME}.safetensors"
    header = b'{"__metadata__": {"k": "\xff\xfe' + SCRIPT.encode() + b'"}}'
    bad.write_bytes(len(header).to_bytes(8, "little") + header)
    page.get_by_role("tab", name="Utilities", exact=True).click()
    field(page, "inspect-path").fill(str(bad))
    page.click("#inspect-run")
    page.wait_for_function(
        "() => document.querySelector('#inspect-report')?.innerText.includes('Error')")
    report = page.inner_text("#inspect-report")
    assert "not UTF-8" in report and "onerror=alert(4)" in report
    no_injection(page)
    good = lora_with_markup(root / "again.safetensors")
    field(page, "inspect-path").fill(str(good))
    page.click("#inspect-run")
    page.wait_for_function(
        "() => document.querySelector('#inspect-report')?.innerText.includes('Modules:')")


def test_caption_editor_shows_names_and_captions_as_text(page, app):
    _, _, root = app
    folder = root / "captions"
    folder.mkdir()
    Image.new("RGB", (16, 16)).save(folder / f"{NAME}.png")
    (folder / f"{NAME}.txt").write_text(PAYLOAD)
    page.get_by_role("tab", name="Utilities", exact=True).click()
    page.get_by_text("Caption editor", exact=True).click()
    field(page, "editor-folder").fill(str(folder))
    # the folder reaches the app before Load is pressed (a CI run once timed out here with
    # nothing to show why: the message below says what the page had instead)
    page.wait_for_function("(want) => document.querySelector('#editor-folder input, "
                           "#editor-folder textarea').value === want", arg=str(folder))
    page.click("#editor-load")
    try:
        page.wait_for_function(
            "() => document.querySelector('#editor-message')?.innerText.includes('1 images')")
    except PlaywrightTimeout:
        raise AssertionError("no '1 images' after Load; the message: "
                             + repr(page.inner_text("#editor-message"))) from None
    table = page.inner_text("#editor-table")
    assert "onerror=alert(4)" in table and "onerror=alert(1)" in table
    no_injection(page)


def test_dataset_check_shows_file_names_as_text(page, app):
    _, _, root = app
    data = root / "dataset"
    (data / "1_thing").mkdir(parents=True)
    Image.new("RGB", (64, 64)).save(data / "1_thing" / "a.png")
    (data / NAME).mkdir()  # a folder without an N_concept name: a warning names it
    Image.new("RGB", (64, 64)).save(data / f"{NAME}.png")  # a stray image: named too
    field(page, "lora-dataset-train_data_dir").fill(str(data))
    page.click("#lora-check")
    page.wait_for_function(
        "() => document.querySelector('#lora-dataset-info')?.innerText.includes('Warnings')")
    info = page.inner_text("#lora-dataset-info")
    assert "onerror=alert(4)" in info and "[link](javascript:alert(5))" in info
    no_injection(page)


def test_run_log_samples_error_and_history_show_markup_as_text(page, app):
    demo, _, root = app
    cfg = config_io.from_dict({"saving": {"output_dir": str(root / "run-out")}})
    demo.runner.submit(cfg, label=PAYLOAD)
    assert demo.runner.wait_idle(30)
    page.wait_for_selector('#progress .ks-status[data-status="failed"]')
    page.wait_for_function(
        "() => document.querySelector('#train-error')?.innerText.includes('onerror')")
    error = page.inner_text("#train-error")
    assert "onerror=alert(1)" in error and "[link](javascript:alert(3))" in error
    log = page.inner_text("#log-tail")
    assert "onerror=alert(1)" in log and len(log) < 40_000
    assert "onerror=alert(1)" in page.inner_text("#progress")  # the label
    page.wait_for_selector("#samples img")
    page.wait_for_function(
        "() => document.querySelector('#queue-table')?.innerText.includes('onerror=alert(1)')")
    page.reload()  # the history as a new page draws it
    page.wait_for_function(
        "() => document.querySelector('#queue-table')?.innerText.includes('onerror=alert(1)')")
    page.click("#compare input")
    page.wait_for_selector("[role=option]")  # the list of runs to compare is open
    no_injection(page)
