"""The advisor knows Qwen-Image: its memory role's small models give the real-size model's
step, with the memory options, from the shipped laws; the sized presets fit their cards, in
the order of musubi-tuner's published figures (42 GB plain, 30 GB fp8, 24 GB fp8 with 16 blocks
swapped, 12 GB with 45)."""

from __future__ import annotations

import pytest

from trainer.advisor.flow_advice import FlowOption, flow_memory, flow_transformer_config
from trainer.config import files as config_io
from trainer.config.paths import PROJECT_ROOT
from trainer.system.device import DeviceInfo

REAL = f'model.pretrained_model_name_or_path="{PROJECT_ROOT}/trainer/assets/families/qwen-image"'
GIB = 2**30


def preset(gb: int):
    return config_io.load(PROJECT_ROOT / f"presets/lora/qwen-image-{gb}gb.toml", [REAL])


def test_the_memory_options_order_as_musubis_table():
    cfg = preset(24)
    config = flow_transformer_config(cfg.model)
    assert config["num_layers"] == 60 and config["joint_attention_dim"] == 3584
    peaks = [flow_memory(config, cfg, (1024, 1024), option, 24 * GIB).peak / GIB
             for option in (FlowOption("full"), FlowOption("fp8"), FlowOption("fp8", 16),
                            FlowOption("fp8", 45))]
    assert peaks == sorted(peaks, reverse=True)
    assert 36 < peaks[0] < 48  # musubi-tuner: 42 GB without fp8 or swap
    assert peaks[2] < 24 and peaks[3] < 12


@pytest.mark.parametrize("gb", [24, 16])
def test_the_sized_presets_fit_their_cards(gb):
    from trainer.advisor.estimate import advise

    card = DeviceInfo("cuda", "NVIDIA GeForce RTX", "cuda:0", gb * GIB, True, True, "2.13")
    advice = advise(preset(gb), card)
    assert not advice.problems, advice.problems
    assert advice.memory is not None and advice.memory.peak < gb * GIB
    assert not advice.recommendations or "Nothing fits" not in advice.recommendations[0].title
