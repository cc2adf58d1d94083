"""Importing kohya_ss's FLUX.1 and SD3 configs (issue 18): the shipped FLUX.1 LoRA preset and the
two SD3 DreamBooth presets import with every key accounted for; the family switch, the
component files (named differently by the LoRA and DreamBooth tabs), the flow settings,
sd-scripts' SD3 objective and the memory options (fp8 base weights, block swap) map; the DDPM
options the form still saves and the other family's keys are reported with the reason instead
of imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config.files import ConfigError
from trainer.families.flux.kohya import flux_units
from trainer.importers.kohya import import_kohya

DATA = Path(__file__).parent / "data" / "kohya_ss"
FLOW = json.loads((DATA / "flow_presets.json").read_text())["presets"]
FLUX, SD3 = "lora/flux1D - adamw8bit fp8", ("dreambooth/sd3 bdsqlsz v1",
                                           "dreambooth/sd3 bdsqlsz v2")


def reasons(report) -> dict[str, str]:
    """kohya key -> why it was not imported (not needed or not supported)."""
    return {**dict(report.not_needed), **{k: r for k, _, r in report.unsupported}}


def targets(report) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, _, target, _ in report.mapped:
        out.setdefault(key, []).append(target)
    return out


@pytest.mark.parametrize("name", sorted(FLOW))
def test_the_flow_presets_import_and_account_for_every_key(name):
    cfg, report = import_kohya(FLOW[name], source=name)
    assert report.keys() == set(FLOW[name])  # nothing dropped silently
    assert cfg.model.model_version == ("flux1" if name == FLUX else "sd3")
    assert cfg.mode == name.split("/")[0]
    assert cfg.model.clip_l == "/path/to/clip_l" and cfg.model.t5xxl == "/path/to/t5xxl"
    assert cfg.dataset.cache_text_encoder_outputs is True


def test_the_flux_preset_keeps_its_flow_settings_and_reports_the_rest():
    data = FLOW[FLUX]
    cfg, report = import_kohya(data, source=FLUX)
    assert cfg.model.ae == "/path/to/ae" and cfg.model.t5xxl_max_token_length == 512
    assert cfg.flow.timestep_sampling == "sigmoid" and cfg.flow.model_prediction_type == "raw"
    assert cfg.flow.guidance_scale == 1.0 and cfg.flow.discrete_flow_shift == 3.0
    assert cfg.network.network_type == "lora" and cfg.network.network_dim == 16
    assert cfg.network.train_blocks == "all"
    why = reasons(report)
    # fp8_base without fp8_base_unet: sd-scripts stores the transformer and T5 in fp8
    assert cfg.model.base_precision == "fp8" and cfg.model.fp8_text_encoders is True
    assert "split_mode" in report.unset and "mem_eff_save" in why
    assert "attention mask" in why["apply_t5_attn_mask"]
    for key in ("noise_offset", "min_snr_gamma", "max_timestep"):  # DDPM: not read by FLUX.1
        assert "flow matching" in why[key], key
    assert cfg.training.noise_offset is None and cfg.training.min_snr_gamma is None
    assert cfg.training.max_timestep is None


@pytest.mark.parametrize("name", SD3)
def test_the_sd3_presets_train_as_sd_scripts_sd3_trainer_does(name):
    cfg, report = import_kohya(FLOW[name], source=name)
    assert cfg.model.clip_g == "/path/to/clip_g"
    assert (cfg.flow.timestep_sampling, cfg.flow.discrete_flow_shift,
            cfg.flow.model_prediction_type) == ("sigma", 1.0, "sigma_scaled")
    assert cfg.flow.weighting_scheme == "logit_normal"
    assert cfg.optimizer.optimizer_type == "PagedAdamW8bit"
    assert any("training_shift" in note for note in report.notes)
    why = reasons(report)
    assert "full range" in why["max_timestep"] and "sdxl" in why["sdxl_cache_text_encoder_outputs"]
    assert cfg.network.train_text_encoder is False  # learning_rate_te = 0, as sd3_train runs


LORA_SD3 = {"LoRA_type": "Standard", "network_dim": 8, "sd3_checkbox": True,
            "sd3_clip_l": "/m/clip_l.safetensors", "sd3_t5xxl": "/m/t5.safetensors",
            "clip_l": "/m/flux_clip_l.safetensors", "t5xxl": "/m/flux_t5.safetensors",
            "clip_g": "/m/clip_g.safetensors", "ae": "/m/ae.safetensors",
            "guidance_scale": 3.5, "timestep_sampling": "sigmoid", "train_blocks": "all",
            "weighting_scheme": "mode", "mode_scale": 1.5, "blocks_to_swap": 8,
            "t5xxl_max_token_length": 512}


def test_the_lora_tabs_sd3_file_names_and_the_flux_keys_it_also_saves():
    cfg, report = import_kohya(LORA_SD3)
    assert cfg.model.clip_l == "/m/clip_l.safetensors" and cfg.model.t5xxl == "/m/t5.safetensors"
    assert cfg.model.ae is None and cfg.flow.guidance_scale == 1.0
    assert cfg.flow.weighting_scheme == "mode" and cfg.flow.mode_scale == 1.5
    why = reasons(report)
    for key in ("clip_l", "t5xxl", "ae", "guidance_scale", "timestep_sampling", "train_blocks",
                "t5xxl_max_token_length"):
        assert "flux1_checkbox" in why[key] or "its switch" in why[key], key
    # SD3's blocks_to_swap counts its joint blocks, as here; block swap needs checkpointing
    assert cfg.training.blocks_to_swap == 8 and cfg.training.gradient_checkpointing
    assert any("gradient_checkpointing turned on" in n for n in report.notes)
    assert not report.unsupported
    assert report.keys() == set(LORA_SD3)


def test_the_dreambooth_tabs_flux_file_names():
    data = {"learning_rate_te": 0, "flux1_checkbox": True, "flux1_clip_l": "/m/cl.safetensors",
            "flux1_t5xxl": "/m/t5.safetensors", "clip_l": "/m/sd3_clip_l.safetensors",
            "ae": "/m/ae.safetensors", "train_blocks": "all", "clip_g": "/m/g.safetensors"}
    cfg, report = import_kohya(data)
    assert cfg.mode == "dreambooth" and cfg.model.clip_l == "/m/cl.safetensors"
    assert cfg.model.t5xxl == "/m/t5.safetensors" and cfg.model.clip_g is None
    why = reasons(report)
    assert "SD 3.5" in why["clip_l"] and "sd3_checkbox" in why["clip_g"]
    assert "dreambooth mode" in why["train_blocks"]


def test_an_sd_file_reports_the_flow_keys_that_kohya_ss_saves_anyway():
    data = {"LoRA_type": "Standard", "network_dim": 8, "flux1_checkbox": False,
            "sd3_checkbox": False, "ae": "", "guidance_scale": 3.5, "clip_g": "",
            "weighting_scheme": "logit_normal", "noise_offset": 0.05}
    cfg, report = import_kohya(data)
    assert cfg.model.model_version == "auto" and cfg.training.noise_offset == 0.05
    assert cfg.flow.guidance_scale == 1.0 and cfg.flow.weighting_scheme == "none"
    assert {"flux1_checkbox", "sd3_checkbox"} <= set(report.unset)
    assert "flux1_checkbox" in reasons(report)["guidance_scale"]


def test_split_mode_trains_the_single_blocks_and_train_blocks_alone_is_not_passed():
    base = {"LoRA_type": "Flux1", "flux1_checkbox": True, "network_dim": 4}
    cfg, report = import_kohya({**base, "train_blocks": "double", "split_mode": True})
    assert cfg.network.train_blocks == "single" and not report.unsupported
    # sd-scripts: split_mode without blocks_to_swap swaps 18 blocks (9 double, 18 single)
    assert cfg.training.blocks_to_swap == flux_units(18)
    cfg, report = import_kohya({**base, "train_blocks": "double", "split_mode": False})
    assert cfg.network.train_blocks == "all"
    assert any(n.startswith("train_blocks:") for n in report.notes)


def test_split_qkv_and_the_options_this_studio_does_not_have():
    data = {"LoRA_type": "Flux1", "flux1_checkbox": True, "network_dim": 4, "split_qkv": False,
            "img_attn_dim": "8", "cpu_offload_checkpointing": True, "fp8_base_unet": True,
            "fp8_base": True, "t5xxl_lr": 1e-5, "train_t5xxl": False, "model_type": "chroma"}
    cfg, report = import_kohya(data)
    why = reasons(report)
    assert "q, k and v each have a LoRA" in why["split_qkv"] and "not available" in why["split_qkv"]
    assert "per-part ranks" in why["img_attn_dim"] and "Chroma" in why["model_type"]
    assert "activations in host memory" in why["cpu_offload_checkpointing"]
    # fp8_base_unet: the transformer in fp8, T5 at the compute precision (sd-scripts)
    assert cfg.model.base_precision == "fp8" and cfg.model.fp8_text_encoders is False
    assert "text_encoder_lr" in why["t5xxl_lr"]
    assert report.keys() == set(data)


@pytest.mark.parametrize("data, named", [
    ({"LoRA_type": "Flux1 OFT", "flux1_checkbox": True}, "Flux1 OFT"),
    ({"LoRA_type": "Standard", "flux1_checkbox": True, "sd3_checkbox": True}, "both on"),
    ({"LoRA_type": "HunyuanImage-2.1"}, "HunyuanImage"),
    ({"LoRA_type": "Standard", "anima_checkbox": True}, "Anima")])
def test_what_still_cannot_be_imported_is_refused_naming_it(data, named):
    with pytest.raises(ConfigError) as err:
        import_kohya(data)
    assert named in str(err.value)


def test_a_ddpm_option_that_the_file_sets_for_sd3_is_reported_not_refused():
    data = {"learning_rate_te": 0, "sd3_checkbox": True, "min_snr_gamma": 5,
            "noise_offset": 0.1, "zero_terminal_snr": True, "min_timestep": 100}
    cfg, report = import_kohya(data)
    why = reasons(report)
    assert "flow matching" in why["min_snr_gamma"] and "flow matching" in why["noise_offset"]
    assert "flow matching" in why["zero_terminal_snr"]
    assert "narrower timestep range" in why["min_timestep"]
    assert cfg.training.zero_terminal_snr is False and cfg.training.min_timestep is None
