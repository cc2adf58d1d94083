"""import-kohya takes kohya_ss' LyCORIS types GLoRA, BOFT and Diag-OFT and their options in
(issue 21): a config as kohya_ss saves it, with the keys it keeps for every type, imports with
nothing "not supported"; a key kohya_ss does not pass for the type, or that the lycoris module
never reads, is "not needed" with the reason."""

from __future__ import annotations

import pytest

from trainer.importers.kohya import import_kohya

# what kohya_ss' LoRA tab saves whatever the type (its defaults, as in its saved JSON files)
SAVED = {"network_dim": 8, "network_alpha": 4, "conv_dim": 4, "conv_alpha": 1,
         "constrain": 0.0, "rescaled": False, "use_tucker": False, "use_scalar": False,
         "rank_dropout": 0, "module_dropout": 0, "train_norm": False}


@pytest.mark.parametrize("lora_type, network_type", [
    ("LyCORIS/GLoRA", "glora"), ("LyCORIS/BOFT", "boft"), ("LyCORIS/Diag-OFT", "diag-oft")])
def test_the_types_import_with_nothing_unsupported(lora_type, network_type):
    cfg, report = import_kohya({"LoRA_type": lora_type, **SAVED, "train_norm": True,
                                "module_dropout": 0.1})
    net = cfg.network
    assert net.network_type == network_type and net.network_dim == 8 and net.conv_dim == 4
    assert net.train_norm and net.module_dropout == 0.1
    assert report.unsupported == []


def test_diag_oft_takes_constrain_and_rescaled():
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/Diag-OFT", **SAVED, "constrain": 0.25,
                                "rescaled": True, "rank_dropout": 0.1})
    assert (cfg.network.constraint, cfg.network.rescaled) == (0.25, True)
    assert cfg.network.rank_dropout == 0.1 and report.unsupported == []


def test_what_the_module_does_not_read_is_not_needed():
    """kohya_ss passes no constraint to BOFT, and BOFT's module reads no rank dropout and no
    Tucker switch: sd-scripts would train without them, so the import does too."""
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/BOFT", **SAVED, "constrain": 0.5,
                                "rescaled": True, "rank_dropout": 0.2, "use_tucker": True})
    net = cfg.network
    assert net.constraint is None and not net.rescaled and net.rank_dropout is None
    skipped = dict(report.not_needed)
    assert {"constrain", "rescaled", "rank_dropout", "use_tucker"} <= skipped.keys()
    assert "does not read it" in skipped["use_tucker"]
    assert report.unsupported == []


def test_lycoris_preset_and_bypass_mode_import():
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/LoHa", **SAVED,
                                "LyCORIS_preset": "attn-only", "bypass_mode": True})
    net = cfg.network
    assert (net.lycoris_preset, net.bypass_mode, net.conv_dim) == ("attn-only", True, None)
    skipped = dict(report.not_needed)
    assert "adapts no 3x3 convolution" in skipped["conv_dim"] and "conv_alpha" in skipped
    assert report.unsupported == []
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/LoCon", "LyCORIS_preset": "full"})
    assert cfg.network.lycoris_preset is None and report.unsupported == []


def test_a_preset_without_text_encoder_modules_turns_the_text_encoder_off():
    """sd-scripts with such a preset creates no text-encoder module, whatever its rate."""
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/LoKr", "LyCORIS_preset": "unet-only",
                                "text_encoder_lr": 1e-4, "unet_lr": 1e-4})
    assert cfg.network.lycoris_preset == "unet-only" and not cfg.network.train_text_encoder
    assert any("unet-only" in n for n in report.notes) and report.unsupported == []


@pytest.mark.parametrize("data, key", [
    ({"LoRA_type": "LyCORIS/LoCon", "LyCORIS_preset": "/home/me/preset.toml"}, "LyCORIS_preset"),
    ({"LoRA_type": "LyCORIS/DoRA", "bypass_mode": True}, "bypass_mode"),
])
def test_what_has_no_equivalent_is_reported(data, key):
    _, report = import_kohya(data)
    assert [k for k, _, _ in report.unsupported] == [key]


def test_ia3_with_its_own_preset_and_standard_lora_with_a_preset():
    cfg, report = import_kohya({"LoRA_type": "LyCORIS/iA3", "LyCORIS_preset": "ia3"})
    assert cfg.network.network_type == "ia3" and report.unsupported == []
    _, report = import_kohya({"LoRA_type": "Standard", "LyCORIS_preset": "attn-only",
                              "bypass_mode": False})
    assert "LyCORIS_preset" in dict(report.not_needed) and report.unsupported == []


@pytest.mark.parametrize("lora_type", ["LyCORIS/DyLoRA", "Kohya DyLoRA"])
def test_dylora_imports_as_sd_scripts_networks_dylora(lora_type):
    cfg, report = import_kohya({"LoRA_type": lora_type, "unit": 4, "network_dim": 8})
    assert (cfg.network.network_type, cfg.network.dylora_unit) == ("lora", 4)
    assert report.unsupported == []  # tests/test_dylora_import.py: the rest of the keys
