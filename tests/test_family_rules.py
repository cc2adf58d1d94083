"""What a model family cannot use is refused when the config loads, naming the setting."""

import pytest

from trainer.config import TrainConfig
from trainer.config.rules.family import family_problems, known_family

FLUX = {"pretrained_model_name_or_path": "embedded:tiny-flux"}
SD3 = {"pretrained_model_name_or_path": "embedded:tiny-sd3"}


def config(**sections):
    return TrainConfig.model_validate(sections)


def test_the_family_is_known_from_the_version_or_the_embedded_name():
    assert known_family(TrainConfig()) == "sd1"
    assert known_family(config(model=FLUX)) == "flux1"
    assert known_family(config(model={"pretrained_model_name_or_path": "/x.safetensors"})) is None
    assert known_family(config(model={"pretrained_model_name_or_path": "/x",
                                      "model_version": "sd3"})) == "sd3"


@pytest.mark.parametrize("model, sections, message", [
    (FLUX, {"training": {"mixed_precision": "fp16"}}, "'fp16' cannot train FLUX.1"),
    (FLUX, {"mode": "textual_inversion", "network": {"token_string": "<t>"}},
     "not available for FLUX.1"),
    (SD3, {"training": {"min_snr_gamma": 5.0}}, "training.min_snr_gamma is a DDPM option"),
    (SD3, {"training": {"noise_offset": 0.1}}, "training.noise_offset is a DDPM option"),
    (FLUX, {"training": {"loss_type": "huber", "huber_schedule": "snr"}},
     "huber_schedule = 'snr' needs a DDPM"),
    (FLUX, {"model": {"prediction_type": "v_prediction"}}, "flow.model_prediction_type"),
    (FLUX, {"model": {"clip_g": "/g.safetensors"}},
     "model.clip_g is set but FLUX.1 does not read it"),
    (FLUX, {"network": {"train_t5xxl": True}}, "needs network.train_text_encoder"),
    ({}, {"model": {"ae": "/ae.safetensors"}}, "model.ae is set but SD 1.x does not read it"),
    ({}, {"network": {"train_t5xxl": True, "train_text_encoder": True}},
     "network.train_t5xxl is set but SD 1.x"),
])
def test_a_setting_the_family_cannot_use_is_refused(model, sections, message):
    data = {**sections}
    data["model"] = {**model, **sections.get("model", {})}
    with pytest.raises(ValueError, match=message):
        TrainConfig.model_validate(data)


def test_sd3_trains_fp16_and_flux_bf16():
    assert config(model=SD3, training={"mixed_precision": "fp16"}).model == \
        config(model=SD3).model
    assert config(model=FLUX, training={"mixed_precision": "bf16"})


def test_a_checkpoint_of_unknown_family_is_checked_once_loaded():
    """A path names no family: nothing is refused at load; the run asks again with the
    detected family and the resolved precision."""
    cfg = config(model={"pretrained_model_name_or_path": "/m.safetensors"},
                 training={"mixed_precision": "auto", "min_snr_gamma": 5.0})
    problems = family_problems(cfg, "flux1", precision="fp16")
    assert problems[0].startswith("training.mixed_precision = 'fp16' (chosen for this device) "
                                  "cannot train FLUX.1")
    assert any("min_snr_gamma" in p for p in problems)
    assert family_problems(cfg, "sdxl") == []
