"""The last kohya_ss keys of issue 21 for SD 1.x / 2.x / SDXL: fused optimizer steps
(fused_backward_pass, fused_optimizer_groups), adaptive_noise_scale without noise_offset in
the shipped LoRA presets, and what is left (train_inpainting)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.importers.kohya import import_kohya

DATA = Path(__file__).parent / "data" / "kohya_ss"
LORA = json.loads((DATA / "lora_presets.json").read_text())["presets"]
SDXL_FT = {"image_folder": "/img", "sdxl_checkbox": True, "optimizer": "Adafactor",
           "optimizer_args": "scale_parameter=False relative_step=False warmup_init=False",
           "lr_scheduler": "constant", "mixed_precision": "bf16",
           "gradient_accumulation_steps": 1, "fused_optimizer_groups": 0}


def unsupported(report):
    return {key: reason for key, _, reason in report.unsupported}


def test_fused_backward_pass_of_an_sdxl_finetune_file_maps_to_the_optimizer_key():
    cfg, report = import_kohya({**SDXL_FT, "fused_backward_pass": True})
    assert cfg.mode == "dreambooth" and cfg.optimizer.fused_backward_pass
    assert cfg.optimizer.fused_optimizer_groups is None
    assert "fused_optimizer_groups" in report.unset and not report.unsupported


def test_fused_optimizer_groups_maps_and_the_flag_form_too():
    cfg, report = import_kohya({**SDXL_FT, "optimizer": "AdamW", "optimizer_args": "",
                                "fused_backward_pass": False, "fused_optimizer_groups": 8})
    assert cfg.optimizer.fused_optimizer_groups == 8 and not cfg.optimizer.fused_backward_pass
    assert "fused_backward_pass" in report.unset and not report.unsupported
    cfg, _ = import_kohya({"learning_rate_te": 1e-5, "mixed_precision": "no",
                           "additional_parameters": "--fused_optimizer_groups 6"})
    assert cfg.optimizer.fused_optimizer_groups == 6


def test_with_both_set_sdxl_train_takes_the_backward_pass():
    cfg, report = import_kohya({**SDXL_FT, "fused_backward_pass": True,
                                "fused_optimizer_groups": 4})
    assert cfg.optimizer.fused_backward_pass and cfg.optimizer.fused_optimizer_groups is None
    assert "fused_backward_pass" in dict(report.not_needed)["fused_optimizer_groups"]


@pytest.mark.parametrize("change, named", [
    ({"mixed_precision": "fp16"}, "fp16's loss scaler"),
    ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps = 1"),
    ({"optimizer": "Prodigy", "optimizer_args": "", "learning_rate": 1}, "'Prodigy' cannot"),
])
def test_what_the_config_refuses_is_not_supported_with_its_reason_and_the_rest_imports(
        change, named):
    cfg, report = import_kohya({**SDXL_FT, "fused_backward_pass": True, **change})
    assert not cfg.optimizer.fused_backward_pass
    assert named in unsupported(report)["fused_backward_pass"]


def test_the_lora_trainer_does_not_read_them():
    cfg, report = import_kohya({"LoRA_type": "Standard", "fused_backward_pass": True})
    assert cfg.mode == "lora" and "LoRA trainer does not read" in dict(
        report.not_needed)["fused_backward_pass"]


def test_blockwise_fused_optimizers_in_an_sd_file_is_the_flux_tabs():
    _, report = import_kohya({**SDXL_FT, "blockwise_fused_optimizers": True})
    assert "flux1_checkbox" in dict(report.not_needed)["blockwise_fused_optimizers"]


@pytest.mark.parametrize("name", ["lora/sd15 - GLoRA v1.0", "lora/sd15 - LoKR v1.0",
                                  "lora/sd15 - LoKr v1.1"])
def test_adaptive_noise_scale_without_noise_offset_had_no_effect(name):
    data = LORA[name]
    assert data["adaptive_noise_scale"] and not data["noise_offset"]
    cfg, report = import_kohya(data)
    assert cfg.training.adaptive_noise_scale is None and not report.unsupported
    assert "noise_offset is off" in dict(report.not_needed)["adaptive_noise_scale"]
    cfg, _ = import_kohya({**data, "noise_offset": 0.05})  # with an offset it is imported
    assert cfg.training.adaptive_noise_scale == 0.005


def test_train_inpainting_is_reported_with_what_it_needs():
    _, report = import_kohya({"learning_rate_te": 1e-5, "train_inpainting": True})
    assert "9-channel" in unsupported(report)["train_inpainting"]
    _, report = import_kohya({"learning_rate_te": 1e-5, "train_inpainting": False})
    assert "train_inpainting" in report.unset


def test_a_raw_network_args_maps_known_items_and_names_the_rest():
    dims = ",".join(["4"] * 25)
    cfg, report = import_kohya({"LoRA_type": "Standard",
                                "network_args": f"loraplus_lr_ratio=16 block_dims={dims} foo=1"})
    assert cfg.network.loraplus_lr_ratio == 16 and cfg.network.block_dims == [4] * 25
    assert list(unsupported(report)) == ["network_args foo"]
    assert "'foo'" in unsupported(report)["network_args foo"]
    _, report = import_kohya({"LoRA_type": "Standard", "network_args": ""})
    assert "network_args" in report.unset
