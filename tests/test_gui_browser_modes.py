"""DreamBooth and Textual Inversion in the real app in headless Chromium: open the mode's tab,
keep the default preset the page starts with (only the output folder changes), click Train and
see the loss curve, "finished", the output file and the sample images; then find the files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gui_helpers import ARTIFACTS, gui_home, one_torch_thread  # noqa: F401
from playwright.sync_api import Page
from test_gui_browser import (  # noqa: F401 - the fixtures are used by name
    CURVE_DRAWN,
    TRAIN_MINUTES,
    app_url,
    browser,
    page,
    text_input,
)

pytestmark = pytest.mark.browser

SAMPLES_SHOWN = """() => [...document.querySelectorAll('#samples img')].some(
  img => img.complete && img.naturalWidth > 0)"""


def finished_job(label: str) -> str:
    """The status line says finished for this job (not for an earlier one of the page)."""
    return ("() => { const s = document.querySelector('#progress .ks-status');"
            f" return s && s.dataset.status === 'finished' && s.innerText.includes('{label}'); }}")


def train_default_preset(view: Page, mode: str, title: str, name: str, out: Path) -> str:
    """Open the tab, keep its default preset (output ``name``), train into ``out``; returns
    the output path that the page shows."""
    view.get_by_role("tab", name=title, exact=True).click()
    shown = text_input(view, f"{mode}-saving-output_name")
    shown.wait_for(state="visible")
    assert shown.input_value() == name  # the page starts with the mode's default preset
    text_input(view, f"{mode}-saving-output_dir").fill(str(out))
    expected = train_and_wait(view, mode, name, out)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    view.locator("#training-panel").screenshot(path=str(ARTIFACTS / f"gui_{mode}_training.png"))
    return str(expected)


def choose_lora_preset(view: Page, preset: str, name: str) -> None:
    """Choose the LoRA tab's preset ``preset`` (presets/lora/<preset>.toml, whose model is
    ``embedded:<preset>`` and whose output name is ``name``) and wait until the form shows it."""
    view.click("#lora-preset input")
    view.get_by_role("option", name=preset, exact=True).click()
    # the page opens with the default preset's "Loaded preset" message: wait for this one's,
    # and for its model in the field (a loaded machine drew them after the old message once)
    view.wait_for_function(
        f"() => document.querySelector('#lora-file-msg').innerText.includes('`{preset}`')"
        f" || document.querySelector('#lora-file-msg').innerText.includes('{preset}.toml')")
    view.wait_for_function(
        "() => document.querySelector('#lora-model-pretrained_model_name_or_path input, "
        "#lora-model-pretrained_model_name_or_path textarea')?.value === "
        f"'embedded:{preset}'")
    assert text_input(view, "lora-saving-output_name").input_value() == name


def train_and_wait(view: Page, mode: str, name: str, out: Path, steps: int = 60) -> Path:
    """Click the tab's Train and wait for the curve, "finished" for this job, the output path
    and the samples; returns the output file."""
    started = time.monotonic()
    view.click(f"#{mode}-train")
    view.wait_for_function(
        f"() => document.querySelector('#{mode}-train-msg').innerText.includes('started')")
    view.wait_for_function(CURVE_DRAWN, timeout=TRAIN_MINUTES * 60_000)
    view.wait_for_function(finished_job(f"{mode}: {name}"), timeout=TRAIN_MINUTES * 60_000)
    expected = out / f"{name}.safetensors"
    view.wait_for_function(
        "() => { const e = document.querySelector('#output-path input, #output-path textarea');"
        f" return e && e.value.endsWith('{expected.name}'); }}")
    assert text_input(view, "output-path").input_value() == str(expected)
    view.wait_for_function(SAMPLES_SHOWN)
    print(f"{mode} {name}: trained and shown in {time.monotonic() - started:.1f}s")
    assert f"{steps} / {steps}" in view.inner_text("#progress")
    assert f"finished at step {steps}" in view.locator("#log-tail .ks-line").first.inner_text()
    return expected


def test_dreambooth_trains_from_its_tab(page, one_torch_thread, tmp_path):  # noqa: F811
    out = tmp_path / "db"
    path = Path(train_default_preset(page, "dreambooth", "DreamBooth", "default-dreambooth",
                                     out))
    assert path == out / "default-dreambooth.safetensors" and path.is_file()
    assert (out / "default-dreambooth" / "model_index.json").is_file()  # the diffusers folder
    assert (out / "default-dreambooth.toml").is_file()
    assert list((out / "sample").glob("*.png"))


def test_textual_inversion_trains_from_its_tab(page, one_torch_thread, tmp_path):  # noqa: F811
    out = tmp_path / "ti"
    path = Path(train_default_preset(page, "textual_inversion", "Textual Inversion",
                                     "default-ti", out))
    assert path == out / "default-ti.safetensors" and path.is_file()
    assert (out / "default-ti.toml").is_file() and list((out / "sample").glob("*.png"))
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:  # an embedding: emb_params [vectors, dim]
        assert list(f.keys()) == ["emb_params"] and f.get_slice("emb_params").get_shape()[0] == 2
