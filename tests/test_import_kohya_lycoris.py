"""import-kohya takes kohya_ss' LyCORIS types GLoRA, BOFT and Diag-OFT and their options in
(issue 21): a config as kohya_ss saves it, with the keys it keeps for every type, imports with
nothing "not supported"; a key kohya_ss does not pass for the type, or that the lycoris module
never reads, is "not needed" with the reason."""

from __future__ import annotations

import pytest

from trainer.importers.kohya_ss import import_kohya

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
