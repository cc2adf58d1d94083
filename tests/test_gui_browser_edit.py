"""Edit training in the real app in headless Chromium: on the LoRA tab choose FLUX.1 Kontext's
tiny preset (presets/lora/tiny-flux-kontext.toml: the sample dataset and its controls), see the
image pairs in the dataset panel, add a sample prompt that takes a control (``--ci``), train a
few steps, and see the loss curve, the sample drawn beside its control, and the LoRA file."""

from __future__ import annotations

import time

import pytest
from gui_helpers import ARTIFACTS, gui_home, one_torch_thread, sample_control  # noqa: F401
from test_gui_browser import (  # noqa: F401 - the fixtures are used by name
    CURVE_DRAWN,
    app_url,
    browser,
    page,
    text_input,
)
from test_gui_browser_modes import choose_lora_preset, train_and_wait

pytestmark = pytest.mark.browser

PRESET, STEPS = "tiny-flux-kontext", 6
PAIRS_SHOWN = """() => {  // the pairs' counts and their thumbnails (a target and its control)
  const info = document.querySelector('#lora-dataset-info');
  return info && info.innerText.includes('Image pairs (FLUX.1 Kontext): 6 of 6 target(s)')
    && [...info.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 0)
         .length >= 2;
}"""
PAIRED_SAMPLE = """() => [...document.querySelectorAll('#samples img')].some(  // control | sample
  img => img.complete && img.naturalWidth > 1.5 * img.naturalHeight)"""


def test_an_edit_preset_shows_pairs_and_trains_with_a_control(page, one_torch_thread,  # noqa: F811
                                                              tmp_path):
    started = time.monotonic()
    name, out = f"{PRESET}-lora", tmp_path / PRESET
    choose_lora_preset(page, PRESET, name)
    page.wait_for_function(PAIRS_SHOWN)
    print(f"pairs shown after {time.monotonic() - started:.1f}s")
    info = page.inner_text("#lora-dataset-info")
    assert "0 missing, 0 orphan control(s)" in info and "10_shapes" in info
    text_input(page, "lora-saving-output_dir").fill(str(out))
    text_input(page, "lora-training-max_train_steps").fill(str(STEPS))
    text_input(page, "lora-sampling-sample_prompts").fill(
        f"add a red circle --ci {sample_control()} --s 2")
    text_input(page, "lora-sampling-sample_every_n_steps").fill(str(STEPS))
    expected = train_and_wait(page, "lora", name, out, steps=STEPS)
    page.wait_for_function(CURVE_DRAWN)
    page.wait_for_function(PAIRED_SAMPLE)
    assert "(left: its control)" in page.inner_text("#samples")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#samples").screenshot(path=str(ARTIFACTS / "gui_edit_sample.png"))
    page.locator("#lora-dataset-info").screenshot(path=str(ARTIFACTS / "gui_edit_pairs.png"))
    assert expected.is_file() and list((out / "sample").glob("*.png"))
    print(f"edit preset: pairs, training and the sample in {time.monotonic() - started:.1f}s")
