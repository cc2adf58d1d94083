"""The advisor on Z-Image: a step simulated on small models of the same width (one and two main
layers; the refiners in the fixed share) and extrapolated per layer equals the whole model's
simulated step; the weights the memory options act on are counted per main layer; the real
release's estimate answers the presets' cards."""

from __future__ import annotations

import json

import pytest

from trainer.advisor import flow_memory as fm
from trainer.config.files import from_dict
from trainer.families import spec

pytestmark = pytest.mark.usefixtures("no_network")


def tiny_config(layers: int) -> dict:
    from trainer.families.zimage.tiny import build_zimage_components

    t = build_zimage_components()["transformer"]
    return dict(t.config, _class_name=type(t).__name__, n_layers=layers)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_per_layer_extrapolation_equals_the_whole_models_step(checkpointing):
    config = tiny_config(4)
    cfg = from_dict({"model": {"model_version": "zimage"},
                     "network": {"network_dim": 1}}, "zimage")
    small = fm.simulate_flow_step(config, cfg, (64, 64), 1, checkpointing)
    whole = fm.simulate_flow_step(config, cfg, (64, 64), 1, checkpointing, full=True)
    assert small == whole


def test_the_weights_are_counted_per_main_layer():
    config = tiny_config(4)
    cfg = from_dict({"model": {"model_version": "zimage"},
                     "network": {"network_dim": 2}}, "zimage")
    w = fm.flow_weights(config, cfg)
    model = fm.meta_transformer(config)
    assert w.total == sum(p.numel() for p in model.parameters())
    assert len(w.units) == 4 and len(set(w.units)) == 1
    layer = sum(p.numel() for p in model.layers[0].parameters())
    assert w.units[0] == layer
    from trainer.families.zimage.lora import target_modules

    lora = sum(2 * (model.get_submodule(m).in_features + model.get_submodule(m).out_features)
               for m in target_modules(model))
    assert w.lora == lora


def test_the_release_counts_six_billion_parameters():
    config = json.loads((spec("zimage").assets("turbo") / "transformer" / "config.json")
                        .read_text(encoding="utf-8"))
    cfg = from_dict({"model": {"model_version": "zimage"},
                     "network": {"network_dim": 1}}, "zimage")
    w = fm.flow_weights(config, cfg)
    assert 6.1e9 < w.total < 6.2e9 and len(w.units) == 30
