"""The Utilities tab in the real app in headless Chromium: inspect a LoRA trained here and see
its report and the bar chart of its update norms; load a folder into the caption editor and see
the thumbnails, edit a caption and save it."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import pytest
from gui_helpers import ARTIFACTS, gui_home, one_torch_thread  # noqa: F401
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from test_gui_browser import app_url, browser, page, text_input  # noqa: F401
from tools_helpers import images_folder
from train_helpers import one_image_dataset, small_config

pytestmark = pytest.mark.browser

BARS_DRAWN = """() => document.querySelectorAll(
  '#inspect-norms g.mark-rect path, #inspect-norms g.mark-rect rect').length > 10"""
CELL_EDITOR_FOCUSED = """() => { const a = document.activeElement;
  return !!a && !!a.closest('#editor-table') && ['TEXTAREA', 'INPUT'].includes(a.tagName); }"""
THUMBNAILS_SHOWN = """() => [...document.querySelectorAll('#editor-table img')].filter(
  img => img.complete && img.naturalWidth > 0).length >= 3"""


@pytest.fixture(scope="module")
def trained_lora(tmp_path_factory, gui_home):  # noqa: F811
    import torch

    from trainer.run.loop import run

    root = tmp_path_factory.mktemp("utilities")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run(small_config(root, one_image_dataset(root / "data"),
                                  network={"train_text_encoder": True},
                                  saving={"output_name": "browser-lora"}))
    finally:
        torch.set_num_threads(threads)
    assert result.status == "finished", result.error
    return Path(result.output_path)


def open_utilities(page: Page) -> None:  # noqa: F811
    page.get_by_role("tab", name="Utilities", exact=True).click()
    text_input(page, "inspect-path").wait_for(state="visible")


def wait_or_explain(page: Page, done: str, fields: list[str], out: Path) -> None:  # noqa: F811
    """Wait for ``done``; past the wait, fail with what the browser held and what the
    in-process server's threads were doing, so that a rare timeout in CI says whether the click,
    the queue or the tool stopped."""
    try:
        page.wait_for_function(done, timeout=120_000)
    except PlaywrightTimeout:
        values = {f: text_input(page, f).input_value() for f in fields}
        reports = page.evaluate("() => [...document.querySelectorAll('[id$=\"-report\"]')]"
                                ".map(e => e.id + ': ' + e.innerText.slice(0, 300))")
        stacks = "\n".join("".join(traceback.format_stack(frame))
                            for frame in sys._current_frames().values())
        pytest.fail(f"timed out: fields {values}; reports {reports}; "
                    f"{out.name} written: {out.is_file()}; the server's threads:\n{stacks}")


def test_inspect_a_trained_lora_from_the_tab(page, trained_lora):  # noqa: F811
    open_utilities(page)
    text_input(page, "inspect-path").fill(str(trained_lora))
    page.click("#inspect-run")
    page.wait_for_function(
        "() => document.querySelector('#inspect-report').innerText.includes('Modules:')")
    report = page.inner_text("#inspect-report")
    assert "LoRA" in report and "SD 1.x" in report and "Training steps: 3 of 3" in report
    assert "Rank: 8; alpha: 8" in report and "a red circle (1)" in report
    page.wait_for_function(BARS_DRAWN)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#inspect-report").screenshot(path=str(ARTIFACTS / "gui_inspect_report.png"))
    page.locator("#inspect-norms").screenshot(path=str(ARTIFACTS / "gui_inspect_norms.png"))


def test_caption_editor_shows_thumbnails_and_saves(page, tmp_path):  # noqa: F811
    folder = images_folder(tmp_path / "imgs")
    (folder / "img0.txt").write_text("red, circle")
    open_utilities(page)
    page.get_by_text("Caption editor", exact=True).click()
    text_input(page, "editor-folder").fill(str(folder))
    page.click("#editor-load")
    page.wait_for_function(
        "() => document.querySelector('#editor-message').innerText.includes('3 images')")
    page.wait_for_function(THUMBNAILS_SHOWN)
    page.locator("#editor-table").screenshot(path=str(ARTIFACTS / "gui_caption_editor.png"))
    cell = page.locator('#editor-table [data-testid="cell-1-2"]').first  # img1's caption
    cell.dblclick()
    # The cell's editor mounts a moment after the double click: keys typed before it has the
    # focus are lost (CI once saved "ue, square"), so type only once it has it.
    page.wait_for_function(CELL_EDITOR_FOCUSED)
    page.keyboard.type("blue, square")
    page.keyboard.press("Enter")
    page.click("#editor-save")
    page.wait_for_function(
        "() => document.querySelector('#editor-message').innerText.includes('Saved 1')")
    assert (folder / "img1.txt").read_text() == "blue, square\n"


def test_caption_editor_shows_the_controls_of_edit_pairs(page, tmp_path):  # noqa: F811
    """With a control images folder the table gains a column of each image's controls, drawn
    beside it, and the instruction caption (now the fourth column) is edited and saved."""
    folder = images_folder(tmp_path / "train" / "1_edit")
    images_folder(tmp_path / "train" / "control" / "1_edit", colors=((9, 9, 9),) * 3)
    open_utilities(page)
    page.get_by_text("Caption editor", exact=True).click()
    text_input(page, "editor-folder").fill(str(folder))
    text_input(page, "editor-control-dir").fill("../control")
    page.click("#editor-load")
    page.wait_for_function("() => document.querySelector('#editor-message').innerText"
                           ".includes('3 with control images')")
    page.wait_for_function("() => [...document.querySelectorAll('#editor-table img')].filter("
                           "img => img.complete && img.naturalWidth > 0).length >= 6")
    assert "controls" in page.inner_text("#editor-table")
    page.locator("#editor-table").screenshot(path=str(ARTIFACTS / "gui_caption_editor_pairs.png"))
    page.locator('#editor-table [data-testid="cell-1-3"]').first.dblclick()  # img1's caption
    page.wait_for_function(CELL_EDITOR_FOCUSED)
    page.keyboard.type("make it night")
    page.keyboard.press("Enter")
    page.click("#editor-save")
    page.wait_for_function(
        "() => document.querySelector('#editor-message').innerText.includes('Saved 1')")
    assert (folder / "img1.txt").read_text() == "make it night\n"


def test_resize_the_trained_lora_from_the_tab(page, trained_lora, tmp_path):  # noqa: F811
    """The optional numbers (conv rank, dynamic parameter) left empty mean unset, not 0."""
    open_utilities(page)
    page.get_by_text("Resize a LoRA", exact=True).click()
    out = tmp_path / "resized.safetensors"
    text_input(page, "resize-path").fill(str(trained_lora))
    text_input(page, "resize-save-to").fill(str(out))
    text_input(page, "resize-rank").fill("2")
    page.click("#resize-run")
    # A first use imports the tool, which took over 30 s once on a cold disk.
    wait_or_explain(
        page, "() => document.querySelector('#resize-report').innerText.includes('Wrote')",
        ["resize-path", "resize-save-to", "resize-rank"], out)
    report = page.inner_text("#resize-report")
    assert "Wrote" in report and "network dim 2" in report and out.is_file(), report
    page.wait_for_function(
        "() => document.querySelector('#resize-table').innerText.includes('8 -> 2')")
