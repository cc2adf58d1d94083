"""Each family's memory role (trainer/families/<folder>/memory.py) holds what the advisor needs
of it: a new family answers in its own folder, not in a branch of the advisor."""

from __future__ import annotations

import pytest

from trainer.advisor import flow_memory as fm
from trainer.advisor.host_memory import folder_parts
from trainer.families import FAMILIES, names, role, spec


@pytest.mark.parametrize("name", names(objective="flow"))
def test_a_flow_family_names_its_release_tokens_and_small_models(name):
    memory = role(name, "memory")
    variant = spec(name).variant(memory.VARIANT)  # a release of the family
    assert memory.T5_TOKENS == variant.t5_length and memory.CLIP_TOKENS >= 0
    assert spec(name).assets(memory.VARIANT).is_dir()
    assert "all" in memory.TRAIN_BLOCKS and memory.FIXED_BLOCKS >= 0
    # per-block values that grow linearly come back as (fixed, per block of each kind)
    fixed, first, second = 5.0, 3.0, 2.0 if len(set(b[1] for b in memory.SHAPES)) > 1 else 0.0
    values = [fixed + b[0] * first + b[1] * second for b in memory.SHAPES]
    assert memory.extrapolate(values) == pytest.approx((fixed, first, second))


@pytest.mark.parametrize("name", names(objective="flow"))
def test_the_flow_family_of_a_transformer_config_is_its_own(name):
    transformer = role(name, "memory").tiny_components()["transformer"]
    config = dict(transformer.config, _class_name=type(transformer).__name__)
    found = fm._family(config)  # FLUX.1 Kontext's transformer is FLUX.1's: its memory role
    assert found == name or role(found, "memory") is role(name, "memory")
    small = fm._small(config, fm._shapes(config)[0])
    assert small["num_layers"] == fm._shapes(config)[0][0]


def test_a_config_of_no_flow_family_is_refused():
    with pytest.raises(ValueError, match="UNet2DConditionModel"):
        fm._family({"_class_name": "UNet2DConditionModel"})


def test_a_folders_parts_follow_the_familys_text_encoders():
    assert folder_parts("flux1") == {"text_encoder": "clip_l", "text_encoder_2": "t5xxl",
                                     "vae": "vae"}
    assert folder_parts("sd3") == {"text_encoder": "clip_l", "text_encoder_2": "clip_g",
                                   "text_encoder_3": "t5xxl", "vae": "vae"}


@pytest.mark.parametrize("name", [s.name for s in FAMILIES.values() if s.embedded])
def test_every_embedded_twin_is_built_by_its_memory_role(name):
    memory = role(name, "memory")
    parts = memory.tiny_components()
    denoiser = "unet" if spec(name).denoiser == "unet" else "transformer"
    assert parts[denoiser] is not None
    if spec(name).denoiser == "unet":
        assert callable(memory.unet_text_inputs)
