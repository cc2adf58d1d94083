"""Z-Image in the real app in headless Chromium: on the LoRA tab choose the tiny Z-Image preset
(presets/lora/tiny-zimage.toml: the embedded Z-Image, 60 steps at 64 px), see the family's own
fields (its text-encoder file; not FLUX.1's CLIP-L nor T5), click Train, watch the loss curve
draw, see "finished", the output path and the samples; the file is a Z-Image LoRA in ComfyUI's
native names."""

from __future__ import annotations

import pytest
from gui_helpers import ARTIFACTS, gui_home, one_torch_thread  # noqa: F401
from playwright.sync_api import Page
from test_gui_browser import (  # noqa: F401 - the fixtures are used by name
    CURVE_DRAWN,
    app_url,
    browser,
    page,
    text_input,
)
from test_gui_browser_modes import train_and_wait

pytestmark = pytest.mark.browser

NAME = "tiny-zimage-lora"


def choose_zimage_preset(view: Page) -> None:
    view.click("#lora-preset input")
    view.get_by_role("option", name="tiny-zimage", exact=True).click()
    view.wait_for_function(
        "() => document.querySelector('#lora-file-msg').innerText.includes('`tiny-zimage`')"
        " || document.querySelector('#lora-file-msg').innerText.includes('tiny-zimage.toml')")
    view.wait_for_function(
        "() => document.querySelector('#lora-model-pretrained_model_name_or_path input, "
        "#lora-model-pretrained_model_name_or_path textarea')?.value === "
        "'embedded:tiny-zimage'")
    assert text_input(view, "lora-saving-output_name").input_value() == NAME


def test_the_tiny_zimage_preset_trains_from_the_lora_tab(page, one_torch_thread,  # noqa: F811
                                                         tmp_path):
    out = tmp_path / "zimage"
    choose_zimage_preset(page)
    # Z-Image's own file settings show, FLUX.1's CLIP-L and T5 do not (kohya_gui/family_view.py)
    search = text_input(page, "lora-search")
    search.fill("file")
    page.wait_for_selector("#lora-model-text_encoder", state="visible")
    page.wait_for_selector("#lora-model-ae", state="visible")
    page.wait_for_selector("#lora-model-clip_l", state="hidden")
    page.wait_for_selector("#lora-model-t5xxl", state="hidden")
    search.fill("")
    text_input(page, "lora-saving-output_dir").fill(str(out))
    expected = train_and_wait(page, "lora", NAME, out)
    page.wait_for_function(CURVE_DRAWN)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#training-panel").screenshot(path=str(ARTIFACTS / "gui_zimage_training.png"))

    assert expected.is_file() and (out / f"{NAME}.toml").is_file()
    assert list((out / "sample").glob("*.png"))
    from safetensors import safe_open

    with safe_open(str(expected), "pt") as f:
        meta, keys = f.metadata(), list(f.keys())
    assert meta["ss_base_model_version"] == "zimage"
    assert any(k.startswith("lora_unet_layers_0_attention_qkv.") for k in keys)
    assert not any(k.startswith("lora_te") for k in keys)
