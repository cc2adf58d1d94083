"""import-kohya's memory options (trainer/importers/kohya/memory.py): fp8_base / fp8_base_unet ->
model.base_precision = "fp8" (and model.fp8_text_encoders for FLUX.1 / SD3 without
fp8_base_unet), blocks_to_swap -> training.blocks_to_swap, as sd-scripts reads them; what its
DreamBooth and textual-inversion trainers do not read is "not needed", and a full fine-tune's
block swap is reported with the reason. FLUX.1's count is checked against the real FLUX.1-dev
transformer's weights (built on the meta device from its config), and imported configs train 2
steps with their base weights in fp8."""

from __future__ import annotations

import json

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401 - fixture
from train_helpers import one_image_dataset

from trainer.config import EMBEDDED_MODEL
from trainer.config import files as config_io
from trainer.config.paths import PROJECT_ROOT
from trainer.events import ListSink, Log
from trainer.families.flux.kohya import flux_units
from trainer.importers.kohya import import_kohya
from trainer.models.block_swap import swap_units
from trainer.run.loop import run

FLUX = {"LoRA_type": "Flux1", "flux1_checkbox": True, "network_dim": 4}
SD3 = {"LoRA_type": "Standard", "sd3_checkbox": True, "network_dim": 4}


def why(report) -> dict[str, str]:
    return {**dict(report.not_needed), **{k: r for k, _, r in report.unsupported}}


def test_fp8_base_on_the_sd_families():
    cfg, report = import_kohya({"LoRA_type": "Standard", "sdxl": True, "fp8_base": True})
    assert cfg.model.base_precision == "fp8" and cfg.model.fp8_text_encoders is False
    assert not report.unsupported and any("CLIP text encoders stay" in n for n in report.notes)
    for data, mode in (({"learning_rate_te": 0, "fp8_base": True}, "dreambooth"),
                       ({"token_string": "<t>", "fp8_base": True}, "textual_inversion")):
        cfg, report = import_kohya(data)
        assert cfg.mode == mode and cfg.model.base_precision == "full"
        assert "do not read it" in why(report)["fp8_base"] and not report.unsupported
    cfg, report = import_kohya({"LoRA_type": "Standard", "fp8_base": False,
                                "additional_parameters": "--fp8_base"})
    assert cfg.model.base_precision == "fp8" and "fp8_base" in report.unset
    # kohya_ss passes fp8_base_unet with flux1_checkbox only
    cfg, report = import_kohya({"LoRA_type": "Standard", "fp8_base_unet": True})
    assert cfg.model.base_precision == "full" and "flux1_checkbox" in why(report)["fp8_base_unet"]


def test_fp8_base_on_flux_and_sd3_stores_t5_too_unless_fp8_base_unet():
    for base in (FLUX, SD3):
        cfg, report = import_kohya({**base, "fp8_base": True})
        assert (cfg.model.base_precision, cfg.model.fp8_text_encoders) == ("fp8", True)
        assert not report.unsupported
    cfg, _ = import_kohya({**FLUX, "fp8_base": True, "fp8_base_unet": True})
    assert (cfg.model.base_precision, cfg.model.fp8_text_encoders) == ("fp8", False)
    cfg, _ = import_kohya({**FLUX, "fp8_base_unet": True})
    assert (cfg.model.base_precision, cfg.model.fp8_text_encoders) == ("fp8", False)


def flux_block_weights() -> tuple[int, int, list[int]]:
    """(a double block's weights, a single block's, the weights of our swap units in forward
    order) of FLUX.1-dev's transformer, built on the meta device from its shipped config."""
    from diffusers import FluxTransformer2DModel

    folder = PROJECT_ROOT / "trainer" / "assets" / "families" / "flux1-dev" / "transformer"
    config = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):
        model = FluxTransformer2DModel.from_config(config)
    size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    units = [size(u) for u in swap_units(model)]
    return size(model.transformer_blocks[0]), size(model.single_transformer_blocks[0]), units


@pytest.mark.parametrize("n", [1, 2, 8, 18, 25, 35])
def test_flux_blocks_to_swap_keeps_at_least_sd_scripts_weights_off_the_device(n):
    """sd-scripts' enable_block_swap(n): n // 2 double blocks and (n - n // 2) * 2 single ones.
    Here the last units in forward order are swapped: the fewest that hold at least as many
    weights."""
    double, single, units = flux_block_weights()
    theirs = (n // 2) * double + (n - n // 2) * 2 * single
    ours = flux_units(n)
    assert sum(units[len(units) - ours:]) >= theirs
    assert sum(units[len(units) - ours + 1:]) < theirs  # one fewer would not do
    cfg, report = import_kohya({**FLUX, "blocks_to_swap": n, "gradient_checkpointing": False})
    assert cfg.training.blocks_to_swap == ours and cfg.training.gradient_checkpointing
    assert not report.unsupported


def test_sd3_blocks_to_swap_counts_joint_blocks_and_sd_files_do_not_pass_it():
    cfg, report = import_kohya({**SD3, "blocks_to_swap": 6, "gradient_checkpointing": True})
    assert cfg.training.blocks_to_swap == 6
    assert not [n for n in report.notes if "swap" in n or "checkpointing" in n]
    cfg, report = import_kohya({**SD3, "blocks_to_swap": 0})
    assert cfg.training.blocks_to_swap is None and "blocks_to_swap" in report.unset
    cfg, report = import_kohya({"LoRA_type": "Standard", "sdxl": True, "blocks_to_swap": 12,
                                "single_blocks_to_swap": 4, "split_mode": True})
    assert cfg.training.blocks_to_swap is None and not report.unsupported
    for key in ("blocks_to_swap", "single_blocks_to_swap", "split_mode"):
        assert "kohya_ss passes it only with flux1_checkbox" in why(report)[key], key


def test_the_legacy_flux_counts_and_dreambooth():
    cfg, report = import_kohya({**FLUX, "double_blocks_to_swap": 4, "single_blocks_to_swap": 8})
    assert cfg.training.blocks_to_swap is None and not report.unsupported
    assert "flux_train.py" in why(report)["double_blocks_to_swap"]
    dreambooth = {"learning_rate_te": 0, "flux1_checkbox": True}
    cfg, report = import_kohya({**dreambooth, "double_blocks_to_swap": 4,
                                "single_blocks_to_swap": 8, "blocks_to_swap": 0})
    reasons = why(report)
    assert "keeps every block on the device" in reasons["double_blocks_to_swap"]
    assert "swaps 8 blocks" in reasons["single_blocks_to_swap"]  # 4 + 8 // 2
    _, report = import_kohya({**dreambooth, "blocks_to_swap": 10, "double_blocks_to_swap": 4})
    assert [k for k, _, _ in report.unsupported] == ["blocks_to_swap"]
    assert "flux_train.py ignores it" in why(report)["double_blocks_to_swap"]


def tiny(cfg, tmp_path, model: str):
    raw = config_io.to_dict(cfg)
    raw["model"] = {**raw["model"], "pretrained_model_name_or_path": model}
    for key in ("clip_l", "t5xxl", "ae"):
        raw["model"].pop(key, None)
    raw["dataset"] = {"train_data_dir": str(one_image_dataset(tmp_path / "data")),
                      "resolution": 64, "min_bucket_reso": 64, "max_bucket_reso": 128,
                      "bucket_reso_steps": 64, "cache_latents_to_disk": False}
    raw["training"].update(max_train_steps=2, max_train_epochs=None, train_batch_size=1,
                           mixed_precision="bf16", log_with="none")
    raw["saving"] = {"output_dir": str(tmp_path / "out"), "save_precision": "fp32"}
    raw["sampling"] = {}
    return config_io.from_dict(raw)


@pytest.mark.parametrize("family", ["sd1", "flux1"])
def test_an_imported_fp8_base_config_trains_two_steps_in_fp8(tmp_path, family,
                                                             one_torch_thread):  # noqa: F811
    data = {"LoRA_type": "Standard", "fp8_base": True, "network_dim": 4} if family == "sd1" \
        else {**FLUX, "fp8_base": True, "network_alpha": 4}
    cfg, _ = import_kohya(data)
    model = EMBEDDED_MODEL if family == "sd1" else "embedded:tiny-flux"
    sink = ListSink()
    result = run(tiny(cfg, tmp_path, model), sink)
    assert result.status == "finished", result.error
    logs = " ".join(e.message for e in sink.of(Log))
    assert "frozen Linear and Conv layers stored in fp8" in logs
    assert ("T5 text encoder stored in fp8" in logs) == (family == "flux1")
