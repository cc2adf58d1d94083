"""The "Load kohya_ss config" control of the mode tabs, without a browser: the handler fills the
form with the imported config and shows the report; files for another tab, another model
family or broken JSON leave the form alone and say why."""

from __future__ import annotations

import json

import gradio as gr
import pytest
from gui_helpers import fake_run, gui_home  # noqa: F401

from kohya_gui.kohya_import import load_kohya_config
from kohya_gui.runner import Runner
from kohya_gui.tabs import dreambooth, lora, textual_inversion
from trainer.importers.kohya import import_kohya_file

TABS = {m.MODE: m for m in (lora, dreambooth, textual_inversion)}
LORA_PRESET = {"LoRA_type": "LyCORIS/LoHa", "network_dim": "16", "network_alpha": 8,
               "conv_dim": 4, "conv_alpha": 2, "optimizer": "AdamW",
               "optimizer_args": '"betas=0.9,0.99" "weight_decay=0.1" "eps=1e-7"',
               "max_resolution": "512,650", "max_train_steps": "100", "lr_warmup": "10",
               "text_encoder_lr": 0, "unet_lr": "1e-4", "train_inpainting": True,
               "wibble": 1}


@pytest.fixture(scope="module")
def built(gui_home):  # noqa: F811
    runner = Runner(fake_run(), write_config=False)
    with gr.Blocks() as blocks:
        tabs = {mode: module.build(runner) for mode, module in TABS.items()}
    yield blocks, tabs
    runner.close()


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_each_tab_has_the_control_wired(built):
    blocks, tabs = built
    api_names = {fn.api_name for fn in blocks.fns.values()}
    for mode, tab in tabs.items():
        assert isinstance(tab.parts["load_kohya"], gr.UploadButton)
        assert f"{mode}_load_kohya" in api_names


def test_a_kohya_lora_file_fills_the_form_and_shows_the_report(built, tmp_path):
    form = built[1]["lora"].form
    path = write(tmp_path, "loha.json", LORA_PRESET)
    values, msg = load_kohya_config(form, path)
    cfg, _ = import_kohya_file(path, "lora")
    assert values == form.values(cfg)
    assert form.config(values) == cfg  # the filled form validates back to the same config
    net = cfg.network
    assert (net.network_type, net.network_dim, net.conv_dim, net.train_text_encoder) == \
        ("loha", 16, 4, False)
    assert values["dataset.resolution"] == "512,648"  # the base W x H, 650 down to 8's
    assert values["optimizer.lr_warmup_steps"] == 10
    assert "Imported loha.json as a lora config" in msg
    assert "512x650 trains at 512x648" in msg and "train_inpainting = True" in msg
    assert "wibble" in msg


def test_a_dreambooth_file_loads_in_the_dreambooth_tab_only(built, tmp_path):
    path = write(tmp_path, "db.json", {"learning_rate": "2e-6", "learning_rate_te": "1e-6",
                                       "max_resolution": "768,768", "epoch": 2})
    form = built[1]["dreambooth"].form
    values, msg = load_kohya_config(form, path)
    cfg = form.config(values)
    assert (cfg.optimizer.learning_rate, cfg.optimizer.text_encoder_lr) == (2e-6, 1e-6)
    assert (cfg.dataset.resolution, cfg.training.max_train_epochs) == (768, 2)
    assert cfg.mode == "dreambooth" and "as a dreambooth config" in msg
    wrong, msg = load_kohya_config(built[1]["lora"].form, path)
    assert wrong is None and "load it in the DreamBooth tab" in msg


@pytest.mark.parametrize(("data", "said"), [
    ({"LoRA_type": "Lumina", "network_dim": 4}, "Lumina"),  # FLUX.1 and SD3 import now
    ('{"LoRA_type": "Standard",\n "network_dim": }', "not valid JSON"),
    ({"LoRA_type": "Standard", "network_dim": 5000}, "network.network_dim = 5000"),
])
def test_a_refused_file_leaves_the_form_and_says_why(built, tmp_path, data, said):
    values, msg = load_kohya_config(built[1]["lora"].form, write(tmp_path, "x.json", data))
    assert values is None and msg.startswith("**The kohya_ss config cannot be loaded:**")
    assert said in msg


def test_no_file_asks_for_one(built):
    values, msg = load_kohya_config(built[1]["lora"].form, None)
    assert values is None and "Choose a kohya_ss .json config" in msg
