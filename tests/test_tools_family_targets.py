"""Each family's targets role (trainer/families/<folder>/targets.py) names its LoRA files'
layers for the tools: the block names inspect tells it by, the file form extract writes, the
label, the SGM names of SDXL's UNet."""

from __future__ import annotations

import pytest

from trainer.families import names, role
from trainer.tools.inspect import CROSS_ATTENTION_WIDTHS, TEXT_WIDTHS, family_label


@pytest.mark.parametrize("name", names(denoiser="transformer"))
def test_a_transformer_family_names_its_blocks_and_its_file_form(name):
    targets = role(name, "targets")
    assert targets.BLOCK_PREFIXES and all(p.startswith("lora_") for p in targets.BLOCK_PREFIXES)
    assert targets.FILE_FORM in ("kohya", "peft")
    assert isinstance(targets.TRAINS_T5, bool)
    for function in ("kohya_targets", "trained_targets", "text_targets"):
        assert callable(getattr(targets, function))


def test_unet_families_say_whether_their_files_use_sgm_names():
    assert {n: role(n, "targets").SGM_NAMES for n in names(denoiser="unet")} == {
        "sd1": False, "sd2": False, "sdxl": True}


def test_labels_and_widths_come_from_the_families():
    assert [family_label(n) for n in names()] == ["SD 1.x", "SD 2.x", "SDXL", "FLUX.2",
                                                  "FLUX.1", "FLUX.1 Kontext", "SD 3 / 3.5",
                                                  "Chroma", "Qwen-Image", "Z-Image"]
    assert family_label("unknown") == "unknown"
    assert CROSS_ATTENTION_WIDTHS == {768: "sd1", 1024: "sd2", 2048: "sdxl"}
    assert TEXT_WIDTHS == {768: "sd1", 1024: "sd2"}
