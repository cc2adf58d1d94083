"""import-kohya: kohya_ss's DyLoRA types and ``unit`` become network.dylora_unit (issue 21)."""

import pytest

from trainer.importers.kohya import import_kohya

# what kohya_ss writes for each DyLoRA type (lora_gui.py's defaults, as users save them)
KOHYA_DYLORA = {"LoRA_type": "Kohya DyLoRA", "network_dim": 16, "network_alpha": 8,
                "conv_dim": 16, "conv_alpha": 1, "unit": 4, "rank_dropout": 0,
                "module_dropout": 0, "network_dropout": 0, "down_lr_weight": "",
                "mid_lr_weight": "", "up_lr_weight": "", "block_dims": "",
                "scale_weight_norms": 0, "dim_from_weights": False, "use_tucker": False}
LYCORIS_DYLORA = {"LoRA_type": "LyCORIS/DyLoRA", "network_dim": 16, "network_alpha": 8,
                  "conv_dim": 16, "conv_alpha": 8, "unit": 2, "LyCORIS_preset": "full",
                  "use_tucker": False, "train_norm": False, "rank_dropout": 0,
                  "module_dropout": 0, "network_dropout": 0, "bypass_mode": False}


@pytest.mark.parametrize("data, unit", [(KOHYA_DYLORA, 4), (LYCORIS_DYLORA, 2)])
def test_kohya_ss_dylora_configs_import_with_nothing_unsupported(data, unit):
    cfg, report = import_kohya(data)
    net = cfg.network
    assert (net.network_type, net.dylora_unit, net.network_dim, net.conv_dim) == \
        ("lora", unit, 16, 16)
    assert net.conv_alpha is None and report.unsupported == []
    assert "conv_alpha" in dict(report.not_needed)


def test_what_networks_dylora_ignores_is_not_needed():
    data = {**KOHYA_DYLORA, "rank_dropout": 0.1, "down_lr_weight": "sine",
            "scale_weight_norms": 1.0}
    cfg, report = import_kohya(data)
    skipped = dict(report.not_needed)
    assert {"rank_dropout", "down_lr_weight", "scale_weight_norms"} <= set(skipped)
    assert cfg.network.down_lr_weight is None and cfg.network.scale_weight_norms is None
    assert report.unsupported == []


def test_unit_defaults_to_one_and_is_not_needed_for_other_types():
    cfg, _ = import_kohya({"LoRA_type": "Kohya DyLoRA", "network_dim": 8, "unit": 0})
    assert cfg.network.dylora_unit == 1
    cfg, report = import_kohya({"LoRA_type": "Standard", "unit": 4})
    assert cfg.network.dylora_unit is None and "unit" in dict(report.not_needed)


def test_lycoris_options_it_cannot_honour_are_reported():
    _, report = import_kohya({**LYCORIS_DYLORA, "LyCORIS_preset": "attn-only", "conv_dim": 4})
    assert {k for k, _, _ in report.unsupported} == {"LyCORIS_preset", "conv_dim"}
