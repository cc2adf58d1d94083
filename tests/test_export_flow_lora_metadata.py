"""FLUX.1 / SD 3.5 LoRA metadata: the values sd-scripts writes (kohya-ss/sd-scripts 48d368fa:
``flux_utils.MODEL_VERSION_FLUX_V1``, ``sd3_utils`` model types, ``sai_model_spec``'s
architectures, ``update_metadata`` of ``flux_train_network.py`` / ``sd3_train_network.py``, every
value ``str()`` of the argparse value), and hashes recomputed from the saved file's bytes."""

import hashlib
import struct

import pytest
import torch
from safetensors import safe_open

from trainer.config import TrainConfig
from trainer.export.metadata import RunFacts, build_lora_metadata
from trainer.families.common.mmdit_lora_file import FlowLoraInfo, flow_lora_metadata, save_flow_lora

FLUX_DEV = FlowLoraInfo("flux1", "dev", guidance_scale=1, timestep_sampling="flux_shift",
                        discrete_flow_shift=3.1582, model_prediction_type="raw",
                        sigmoid_scale=1, weighting_scheme="none", logit_mean=0, logit_std=1,
                        mode_scale=1.29)


def base_metadata():
    cfg = TrainConfig()
    cfg.network.network_dim, cfg.network.network_alpha = 16, 8.0
    cfg.saving.output_name = "my_flux"
    return build_lora_metadata(cfg, RunFacts(steps=10, epoch=1))


def test_flux_metadata_as_sd_scripts_writes_it():
    meta = flow_lora_metadata(FLUX_DEV, base_metadata())
    assert meta["ss_base_model_version"] == "flux1"
    assert meta["modelspec.architecture"] == "flux-1-dev/lora"
    assert meta["modelspec.implementation"] == "https://github.com/black-forest-labs/flux"
    assert "modelspec.prediction_type" not in meta  # sd-scripts writes none for FLUX.1
    assert meta["ss_network_module"] == "networks.lora_flux"
    assert (meta["ss_guidance_scale"], meta["ss_timestep_sampling"],
            meta["ss_discrete_flow_shift"], meta["ss_model_prediction_type"],
            meta["ss_sigmoid_scale"], meta["ss_weighting_scheme"], meta["ss_logit_mean"],
            meta["ss_logit_std"], meta["ss_mode_scale"], meta["ss_apply_t5_attn_mask"],
            meta["ss_model_type"]) == ("1.0", "flux_shift", "3.1582", "raw", "1.0", "none",
                                       "0.0", "1.0", "1.29", "False", "flux")
    assert (meta["ss_network_dim"], meta["ss_output_name"]) == ("16", "my_flux")  # kept
    assert all(isinstance(v, str) for v in meta.values())
    schnell = flow_lora_metadata(FlowLoraInfo("flux1", "schnell"))
    assert schnell["modelspec.architecture"] == "flux-1-schnell/lora"
    assert schnell["ss_guidance_scale"] == "None"  # unset, as sd-scripts writes None


@pytest.mark.parametrize("variant, arch", [
    ("medium", "stable-diffusion-3-medium/lora"),
    ("5-medium", "stable-diffusion-3-5-medium/lora"),
    ("5-large", "stable-diffusion-3-5-large/lora"),
])
def test_sd3_metadata_as_sd_scripts_writes_it(variant, arch):
    info = FlowLoraInfo("sd3", variant, weighting_scheme="logit_normal", logit_mean=0.0,
                        logit_std=1.0, mode_scale=1.29)
    meta = flow_lora_metadata(info, base_metadata())
    assert meta["ss_base_model_version"] == variant
    assert meta["modelspec.architecture"] == arch
    assert meta["modelspec.implementation"] == "diffusers"
    assert meta["modelspec.prediction_type"] == "epsilon"
    assert (meta["ss_weighting_scheme"], meta["ss_logit_mean"], meta["ss_apply_lg_attn_mask"],
            meta["ss_apply_t5_attn_mask"]) == ("logit_normal", "0.0", "False", "False")
    assert "ss_guidance_scale" not in meta and "ss_model_type" not in meta
    with_shift = flow_lora_metadata(FlowLoraInfo("sd3", variant, timestep_sampling="shift",
                                                 discrete_flow_shift=3))
    assert (with_shift["ss_timestep_sampling"], with_shift["ss_discrete_flow_shift"]) == (
        "shift", "3.0")


def test_unknown_family_or_variant_is_refused():
    with pytest.raises(ValueError, match="'flux1' or 'sd3'"):
        FlowLoraInfo("sdxl", "dev")
    with pytest.raises(ValueError, match="variant 'large'"):
        FlowLoraInfo("sd3", "large")


def test_saved_file_carries_metadata_and_hashes_of_its_bytes(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {"lora_unet_single_blocks_0_linear2.lora_down.weight": torch.randn(4, 160,
                                                                              generator=gen),
               "lora_unet_single_blocks_0_linear2.lora_up.weight": torch.randn(32, 4,
                                                                            generator=gen),
               "lora_unet_single_blocks_0_linear2.alpha": torch.tensor(2.0)}
    stale = {**base_metadata(), "sshs_model_hash": "stale"}
    path = save_flow_lora(tmp_path / "f.safetensors", tensors, FLUX_DEV, stale)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["modelspec.architecture"] == "flux-1-dev/lora"
    # the model hash: SHA-256 of the tensor data, after the header
    data = path.read_bytes()
    start = 8 + struct.unpack("<Q", data[:8])[0]
    assert meta["sshs_model_hash"] == hashlib.sha256(data[start:]).hexdigest()
    assert meta["modelspec.hash_sha256"] == "0x" + meta["sshs_model_hash"]
    with pytest.raises(ValueError, match="no LoRA tensors"):
        save_flow_lora(tmp_path / "empty.safetensors", {}, FLUX_DEV)
