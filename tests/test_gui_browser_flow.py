"""FLUX.1 in the real app in headless Chromium: on the LoRA tab choose the tiny FLUX.1 preset
(presets/lora/tiny-flux.toml: the embedded FLUX.1-dev, 60 steps at 64 px), see the family's own
fields, click Train, watch the loss curve draw, see "finished", the output path and the samples;
the file is a FLUX.1 LoRA in sd-scripts' form."""

from __future__ import annotations

import pytest
from gui_helpers import ARTIFACTS, gui_home, one_torch_thread  # noqa: F401
from test_gui_browser import (  # noqa: F401 - the fixtures are used by name
    CURVE_DRAWN,
    app_url,
    browser,
    page,
    text_input,
)
from test_gui_browser_modes import choose_lora_preset, train_and_wait

pytestmark = pytest.mark.browser

NAME = "tiny-flux-lora"


def test_the_tiny_flux_preset_trains_from_the_lora_tab(page, one_torch_thread,  # noqa: F811
                                                       tmp_path):
    out = tmp_path / "flux"
    choose_lora_preset(page, "tiny-flux", NAME)
    # the family's own fields show for a FLUX.1 model, SD 3.5's do not (kohya_gui/family_view.py)
    # each edit of the search is one round trip that redraws the form: filled at once, not
    # typed key by key (eight redraws that a loaded machine did not finish in 30 s once)
    search = text_input(page, "lora-search")
    search.fill("guidance")
    page.wait_for_selector("#lora-flow-guidance_scale", state="visible")
    search.fill("clip")
    page.wait_for_selector("#lora-model-clip_l", state="visible")
    page.wait_for_selector("#lora-model-clip_g", state="hidden")
    search.fill("")
    text_input(page, "lora-saving-output_dir").fill(str(out))
    expected = train_and_wait(page, "lora", NAME, out)
    page.wait_for_function(CURVE_DRAWN)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#training-panel").screenshot(path=str(ARTIFACTS / "gui_flux_training.png"))

    assert expected.is_file() and (out / f"{NAME}.toml").is_file()
    assert list((out / "sample").glob("*.png"))
    from safetensors import safe_open

    with safe_open(str(expected), "pt") as f:
        meta, keys = f.metadata(), list(f.keys())
    assert meta["ss_base_model_version"] == "flux1"
    assert any(k.startswith("lora_unet_double_blocks_0_img_attn_qkv.") for k in keys)
    assert any(k.startswith("lora_te1_") for k in keys)  # the preset trains CLIP-L too
