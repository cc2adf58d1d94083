"""What a model family cannot use is refused when the config loads, naming the setting."""

import pytest

from trainer.config import TrainConfig
from trainer.config.rules.family import family_problems, hinted, known_family
from trainer.families import spec

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


# A setting's ``families`` hint is its only declaration of the families that read it: a value
# other than its default is refused for the others, one case per kind of setting.
@pytest.mark.parametrize("model, sections, message", [
    # a DDPM noise option and a loss option (sd-scripts' flow trainers read neither)
    (FLUX, {"training": {"ip_noise_gamma": 0.1}},
     "training.ip_noise_gamma is a DDPM option; FLUX.1 trains with flow matching"),
    (FLUX, {"training": {"v_pred_like_loss": 0.2}},
     "training.v_pred_like_loss is a DDPM option; FLUX.1 trains with flow matching"),
    (SD3, {"training": {"multires_noise_discount": 0.5}},
     "training.multires_noise_discount is a DDPM option; SD 3.5 .*set it back to 0.3"),
    # a flow-matching option on a DDPM family
    ({"pretrained_model_name_or_path": "embedded:tiny-sdxl"}, {"flow": {"guidance_scale": 3.5}},
     "flow.guidance_scale is a flow-matching option; SDXL trains with a DDPM noise schedule; "
     "set it back to 1.0"),
    # a component file and a text-encoder setting of other families
    ({"pretrained_model_name_or_path": "embedded:tiny-sdxl"}, {"model": {"t5xxl": "/t5.st"}},
     r"model.t5xxl is set but SDXL does not read it \(FLUX.1 / FLUX.1 Kontext / SD 3.5 / "
     r"Chroma only\)"),
    (SD3, {"model": {"ae": "/ae.safetensors"}},
     r"model.ae is set but SD 3.5 does not read it \(FLUX.1 / FLUX.1 Kontext / FLUX.2 / "
     r"Z-Image / Chroma only\)"),
    ({}, {"model": {"t5xxl_max_token_length": 128}}, "model.t5xxl_max_token_length is set but "
                                                     "SD 1.x"),
    ({}, {"model": {"fp8_text_encoders": True}}, "model.fp8_text_encoders is set but SD 1.x"),
    (FLUX, {"model": {"clip_skip": 2}}, "model.clip_skip .*FLUX.1.*set it back to 1"),
    # network options
    (SD3, {"network": {"train_blocks": "single"}},
     r"network.train_blocks is set but SD 3.5 does not read it \(FLUX.2 / FLUX.1 / "
     r"FLUX.1 Kontext / Chroma / Z-Image only\)"),
    (FLUX, {"network": {"conv_dim": 4}}, "network.conv_dim is set but FLUX.1 does not read it"),
    (FLUX, {"network": {"train_text_encoder_2": True}},
     r"network.train_text_encoder_2 is set but FLUX.1 does not read it \(SDXL / SD 3.5 only\)"),
    (SD3, {"network": {"dylora_unit": 4}}, "network.dylora_unit is set but SD 3.5"),
    (FLUX, {"network": {"network_weights": "/l.safetensors"}},
     "network.network_weights: continuing a LoRA is not available for FLUX.1"),
    # an optimizer option
    ({}, {"optimizer": {"text_encoder_2_lr": 1e-5}},
     "optimizer.text_encoder_2_lr is set but SD 1.x does not read it"),
    # a sampling option (the flow families' pipelines bring their own scheduler)
    (FLUX, {"sampling": {"sample_sampler": "ddim"}},
     "sampling.sample_sampler is set but FLUX.1 does not read it .*set it back to 'euler_a'"),
    # dataset caption options
    (FLUX, {"dataset": {"weighted_captions": True}},
     "dataset.weighted_captions is set but FLUX.1 does not read it"),
    (SD3, {"dataset": {"max_token_length": 225}}, "dataset.max_token_length is set but SD 3.5"),
])
def test_a_setting_outside_its_families_hint_is_refused(model, sections, message):
    data = {**sections, "model": {**model, **sections.get("model", {})}}
    with pytest.raises(ValueError, match=message):
        TrainConfig.model_validate(data)


def test_the_hinted_settings_load_for_their_families_and_at_their_defaults_for_all():
    assert config(model=FLUX, training={"noise_offset": None, "multires_noise_discount": 0.3},
                  flow={"guidance_scale": 3.5}, network={"train_blocks": "single"})
    assert config(training={"ip_noise_gamma": 0.1, "v_pred_like_loss": 0.2},
                  dataset={"weighted_captions": True}, flow={"guidance_scale": 1.0})
    assert config(model=SD3, network={"train_text_encoder_2": True},
                  optimizer={"text_encoder_2_lr": 1e-5})


def test_the_run_refuses_hinted_settings_once_a_path_reads_as_a_family():
    """A path names no family at load; the run's second call gets the same refusals."""
    cfg = config(model={"pretrained_model_name_or_path": "/m.safetensors"},
                 training={"ip_noise_gamma": 0.1, "v_pred_like_loss": 0.2},
                 network={"train_blocks": "double"})
    problems = family_problems(cfg, "flux1")
    assert [p.split(" ")[0] for p in problems] == ["training.ip_noise_gamma",
                                                   "training.v_pred_like_loss"]
    assert family_problems(cfg, "sdxl") == ["network.train_blocks is set but SDXL does not read "
                                            "it (FLUX.2 / FLUX.1 / FLUX.1 Kontext / Chroma / "
                                            "Z-Image only); set it back to 'all'"]


def test_the_model_versions_and_the_hints_come_from_the_registry():
    from typing import get_args

    from trainer.config import FAMILIES, ModelSection
    from trainer.families import FAMILIES as REGISTRY
    from trainer.families import names

    assert FAMILIES == names()
    # then the variants only the setting can name (a file with its family's base model's keys)
    variants = tuple(v.version for s in REGISTRY.values() for v in s.variants if v.version)
    assert "qwen_image_edit_2509" in variants
    assert get_args(ModelSection.model_fields["model_version"].annotation) == \
        ("auto", *names(), *variants)
    hints = {f"{s}.{n}": fams for s, n, _, fams in hinted()}
    assert hints["training.ip_noise_gamma"] == names(objective="ddpm")
    assert hints["flow.guidance_scale"] == names(objective="flow")
    assert hints["network.block_dims"] == names(denoiser="unet")


def test_a_familys_own_refusals_and_lora_blocks_live_in_its_folder():
    from trainer.config.lora_blocks import BLOCK_COUNTS, block_index
    from trainer.families import role

    assert BLOCK_COUNTS == {"sd1": (12, 1, 25), "sd2": (12, 1, 25), "sdxl": (9, 3, 23)}
    assert block_index("lora_unet_input_blocks_4_1_proj_in", "sdxl") == 5
    assert block_index("lora_unet_up_blocks_1_attentions_2_proj_in", "sd2") == 18
    assert block_index("lora_unet_double_blocks_0_img_attn_qkv", "flux1") == -1
    cfg = config(model={"pretrained_model_name_or_path": "/m.safetensors"},
                 training={"mixed_precision": "fp16"})
    assert role("flux1", "rules").problems(cfg, spec("flux1"))[0].startswith(
        "training.mixed_precision = 'fp16' cannot train FLUX.1")
    assert role("sd3", "rules").problems(cfg, spec("sd3")) == []
