"""The page on a laptop screen (1366x768) in headless Chromium: after choosing the default
preset, Train is in view without scrolling; labels are names a person reads, with the TOML key
under them; the search box finds min_snr_gamma by typing "snr", its matches in view and one
under the other (no room left where hidden rows were); the advisor under Train shows a memory
estimate; after Train, the loss curve stays in view while the form is scrolled to its end (the
screenshot of the page during the run: tests/artifacts/gui_layout_running.png); and on a narrow
screen the panel comes above the form."""

from __future__ import annotations

import pytest
from gui_helpers import ARTIFACTS, PAGE_TIMEOUT_MS, gui_home, one_torch_thread  # noqa: F401
from playwright.sync_api import Page
from test_gui_browser import (  # noqa: F401 - the fixtures are used by name
    CURVE_DRAWN,
    TRAIN_MINUTES,
    app_url,
    browser,
    choose_default_preset,
    text_input,
    wait_status,
)

pytestmark = pytest.mark.browser

LAPTOP = {"width": 1366, "height": 768}
SCREENSHOT = ARTIFACTS / "gui_layout_running.png"


# the rows of the "snr" matches: v_pred_like_loss; zero_terminal_snr + min_snr_gamma;
# debiased_estimation_loss + ...: each starts less than 40 px under the one above
ROWS_CLOSE = """() => {
  const names = ['zero_terminal_snr', 'min_snr_gamma', 'debiased_estimation_loss',
                 'scale_v_pred_loss_like_noise_pred', 'v_pred_like_loss'];
  const boxes = names.map(n => document.querySelector('#lora-training-' + n)
                                       .getBoundingClientRect());
  if (boxes.some(r => r.height <= 0)) return false;
  const rows = [...new Set(boxes.map(r => Math.round(r.top)))].sort((a, b) => a - b)
    .map(top => boxes.filter(r => Math.round(r.top) === top));
  const bottom = row => Math.max(...row.map(r => r.bottom));
  return rows.every((row, i) => i === 0 || row[0].top - bottom(rows[i - 1]) < 40); }"""


def open_page(browser, url: str, viewport: dict) -> tuple[object, Page]:  # noqa: F811
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(url)
    return context, page


@pytest.fixture
def laptop(browser, app_url):  # noqa: F811
    context, page = open_page(browser, app_url, LAPTOP)
    yield page
    context.close()


IN_VIEW = """(selector) => { const r = document.querySelector(selector).getBoundingClientRect();
  return r.width > 0 && r.left >= 0 && r.top >= 0 && r.right <= window.innerWidth
    && r.bottom <= window.innerHeight; }"""


def in_view(page: Page, selector: str, viewport: dict = LAPTOP) -> bool:
    box = page.locator(selector).bounding_box()
    return (box is not None and box["x"] >= 0 and box["y"] >= 0
            and box["x"] + box["width"] <= viewport["width"]
            and box["y"] + box["height"] <= viewport["height"])


def choose_preset(page: Page, name: str = "default") -> None:
    page.click("#lora-preset input")
    page.get_by_role("option", name=name, exact=True).click()
    page.wait_for_function(
        "() => document.querySelector('#lora-file-msg').innerText.includes('Loaded preset')")


def test_train_labels_search_and_advice_without_scrolling(laptop):
    page = laptop
    choose_preset(page)
    assert page.evaluate("window.scrollY") == 0
    assert in_view(page, "#lora-train") and in_view(page, "#stop")
    dim = page.locator("#lora-network-network_dim")
    assert "Network rank (dim)" in dim.inner_text() and "network_dim" in dim.inner_text()
    assert "Learning-rate warm-up steps" in page.inner_text("#lora-optimizer-lr_warmup_steps")
    assert page.locator("#lora-mode").count() == 0  # no mode box: the tab is the mode
    page.wait_for_function("() => document.querySelector('#lora-advisor-summary')"
                           ".innerText.includes('Estimated peak memory')")
    assert in_view(page, "#lora-advisor-summary")
    assert "fits" in page.inner_text("#lora-advisor-summary")
    search = text_input(page, "lora-search")
    search.fill("snr")  # one round trip (typed key by key: one per key)
    page.wait_for_selector("#lora-training-min_snr_gamma", state="visible")  # in "Advanced"
    page.wait_for_selector("#lora-network-network_dim", state="hidden")
    # no empty space where the hidden rows were: each row of matches right under the last
    # (waited for: the page lays the rows out again after the search's update)
    page.wait_for_function(ROWS_CLOSE)
    # the matches come first in view: "snr" finds five settings now (v_pred_like_loss's help
    # names the SNR too), and the first of them in the section's order (zero_terminal_snr,
    # with the noise options) sits right under the search box (waited for too: on a loaded
    # machine the layout settled after the check once)
    page.wait_for_function(IN_VIEW, arg="#lora-training-zero_terminal_snr")
    assert in_view(page, "#lora-training-zero_terminal_snr")
    search.fill("")
    page.wait_for_selector("#lora-network-network_dim", state="visible")


def test_the_curve_stays_in_view_while_the_form_scrolls(laptop, one_torch_thread,  # noqa: F811
                                                        tmp_path):
    page = laptop
    choose_default_preset(page, tmp_path / "out")
    page.click("#lora-train")
    page.wait_for_function(
        "() => document.querySelector('#lora-train-msg').innerText.includes('started')")
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    page.wait_for_function(CURVE_DRAWN, timeout=TRAIN_MINUTES * 60_000)
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    assert page.evaluate("window.scrollY") > LAPTOP["height"]  # the form is long
    assert in_view(page, "#lora-advanced-saving")  # the end of the form is on screen
    assert in_view(page, "#loss-plot") and in_view(page, "#progress")
    assert in_view(page, "#lora-train") and in_view(page, "#stop")  # one click from here
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    wait_status(page, "finished")


def test_a_narrow_screen_puts_the_panel_above_the_form(browser, app_url):  # noqa: F811
    narrow = {"width": 800, "height": 900}
    context, page = open_page(browser, app_url, narrow)
    try:
        page.wait_for_selector("#lora-train")
        panel = page.locator("#training-panel").bounding_box()
        form = page.locator("#lora-files").bounding_box()
        assert panel["y"] + panel["height"] <= form["y"] + 1
        assert in_view(page, "#lora-train", narrow)
    finally:
        context.close()
