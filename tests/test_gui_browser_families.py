"""The newer families in the real app in headless Chromium: on the LoRA tab choose a family's
tiny preset (presets/lora/tiny-zimage.toml, tiny-flux2.toml, tiny-qwen-image.toml: the embedded
twin, 60 steps at 64 px), see the family's own fields (its text-encoder file; not FLUX.1's
CLIP-L nor T5), click Train, watch the loss curve draw, see "finished", the output path and the
samples; the file is the family's LoRA under the names of its original model layout, as
ComfyUI maps them (``lora_unet_`` + the module path with dots as underscores)."""

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

# preset -> (ss_base_model_version, a module of block 0 in the original model's layout,
# the family's file fields that show, FLUX.1's that do not and the fields it has no use for)
FAMILIES = {
    # Z-Image's own checkpoint: layers.N.attention.qkv (fused)
    "tiny-zimage": ("zimage", "layers.0.attention.qkv", ("text_encoder", "ae"),
                    ("clip_l", "t5xxl")),
    # Black Forest Labs' FLUX.2 checkpoint: double_blocks.N.img_attn.qkv, single_blocks.N.linear1
    "tiny-flux2": ("flux2", "double_blocks.0.img_attn.qkv", ("text_encoder", "ae"),
                   ("clip_l", "t5xxl")),
    # Qwen-Image's released checkpoint is diffusers-named: transformer_blocks.N.attn.to_q; its
    # VAE comes with it (no ae file field)
    "tiny-qwen-image": ("qwen_image", "transformer_blocks.0.attn.to_q", ("text_encoder",),
                        ("clip_l", "t5xxl", "ae")),
}


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_a_tiny_family_preset_trains_from_the_lora_tab(page, one_torch_thread,  # noqa: F811
                                                       tmp_path, preset):
    version, module, shown, hidden = FAMILIES[preset]
    name, out = f"{preset}-lora", tmp_path / preset
    choose_lora_preset(page, preset, name)
    # the family's own file settings show, the others' do not (kohya_gui/family_view.py)
    search = text_input(page, "lora-search")
    search.fill("file")
    for field in shown:
        page.wait_for_selector(f"#lora-model-{field}", state="visible")
    for field in hidden:
        page.wait_for_selector(f"#lora-model-{field}", state="hidden")
    search.fill("")
    text_input(page, "lora-saving-output_dir").fill(str(out))
    expected = train_and_wait(page, "lora", name, out)
    page.wait_for_function(CURVE_DRAWN)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#training-panel").screenshot(path=str(ARTIFACTS / f"gui_{preset}_training.png"))

    assert expected.is_file() and (out / f"{name}.toml").is_file()
    assert list((out / "sample").glob("*.png"))
    from safetensors import safe_open

    with safe_open(str(expected), "pt") as f:
        meta, keys = f.metadata(), list(f.keys())
    assert meta["ss_base_model_version"] == version
    assert f"lora_unet_{module.replace('.', '_')}.lora_down.weight" in keys
    assert not any(k.startswith("lora_te") for k in keys)
