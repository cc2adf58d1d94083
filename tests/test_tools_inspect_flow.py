"""Inspecting FLUX.1 and SD 3.5 LoRA files as our exporters write them (trainer/export/
flux_lora.py, sd3_lora.py): the family from the metadata and, without it, from the block names;
the parts (transformer, CLIP, T5); rank and alpha per module; each module's update norm against
peft's own delta weight."""

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors.torch import save_file

from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora
from trainer.families.common.tiny_mmdit import build_flux_components, build_sd3_components
from trainer.families.flux.lora import (
    CLIP_TARGETS,
    T5_TARGETS,
    flux_kohya_state_dict,
    flux_target_modules,
)
from trainer.families.sd3.lora import sd3_state_dict, sd3_target_modules
from trainer.tools.inspect import format_inspect, inspect
from trainer.tools.options import InspectOptions


def randomize(*modules):
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in modules:
            for name, p in module.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


@pytest.fixture(scope="module")
def flux_lora():
    comps = build_flux_components()
    tr, clip, t5 = comps["transformer"], comps["text_encoder"], comps["text_encoder_2"]
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=2.0,
                                       target_modules=flux_target_modules(tr)), tr)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=2.0, target_modules=CLIP_TARGETS), clip)
    inject_adapter_in_model(LoraConfig(r=2, lora_alpha=1.0, target_modules=T5_TARGETS), t5)
    randomize(tr, clip, t5)
    return flux_kohya_state_dict(tr, clip, t5, dtype=torch.float32)


@pytest.fixture(scope="module")
def sd3_adapted():
    comps = build_sd3_components()
    tr = comps["transformer"]
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=2.0,
                                       target_modules=sd3_target_modules(tr)), tr)
    for key in ("text_encoder", "text_encoder_2"):
        inject_adapter_in_model(LoraConfig(r=2, lora_alpha=2.0, target_modules=CLIP_TARGETS),
                                comps[key])
    randomize(tr, comps["text_encoder"], comps["text_encoder_2"])
    return comps


def test_flux_file_family_parts_and_fused_ranks(tmp_path, flux_lora):
    path = save_flow_lora(tmp_path / "f.safetensors", flux_lora, FlowLoraInfo("flux1", "dev"))
    report = inspect(InspectOptions(path=str(path)))
    assert (report.family, report.family_reason) == ("flux1", "from the metadata")
    assert report.parts() == {"transformer": 13, "te1": 12, "te3": 14}
    ranks = {m.name: (m.rank, m.alpha) for m in report.modules}
    assert ranks["lora_unet_double_blocks_0_img_attn_qkv"] == (12, 6.0)
    assert ranks["lora_unet_single_blocks_0_linear1"] == (16, 8.0)
    assert ranks["lora_unet_double_blocks_0_img_mod_lin"] == (4, 2.0)
    assert ranks["lora_te3_encoder_block_0_layer_0_SelfAttention_q"] == (2, 1.0)
    text = format_inspect(report)
    assert "FLUX.1" in text and "transformer 13" in text and "T5 14" in text

    bare = tmp_path / "bare.safetensors"  # no metadata: the BFL block names tell
    save_file(dict(flux_lora), str(bare))
    report = inspect(InspectOptions(path=str(bare)))
    assert report.family == "flux1" and "block names" in report.family_reason


def test_sd3_file_is_read_with_peft_keys_and_norms_match_peft(tmp_path, sd3_adapted):
    comps = sd3_adapted
    tensors = sd3_state_dict(comps["transformer"], comps["text_encoder"],
                             comps["text_encoder_2"], dtype=torch.float32)
    path = save_flow_lora(tmp_path / "s.safetensors", tensors, FlowLoraInfo("sd3", "5-large"))
    report = inspect(InspectOptions(path=str(path)))
    assert report.family == "sd3" and not report.unknown_keys
    assert report.parts() == {"transformer": len(sd3_target_modules(comps["transformer"])),
                              "te": 12, "te2": 12}
    stats = {m.name: m for m in report.modules}
    q = stats["lora_transformer_transformer_blocks_0_attn2_to_q"]
    assert (q.rank, q.alpha) == (4, None)  # alpha folded into lora_B: scale 1
    layer = comps["transformer"].transformer_blocks[0].attn2.to_q
    delta = layer.get_delta_weight("default").detach()
    assert q.norm == pytest.approx(float(delta.norm()), rel=1e-4)
    save_file(dict(tensors), str(tmp_path / "bare.safetensors"))
    assert inspect(InspectOptions(path=str(tmp_path / "bare.safetensors"))).family == "sd3"


def test_diffusers_own_flux_file_without_metadata_is_flux_not_sd3(tmp_path):
    """diffusers' FluxPipeline.save_lora_weights names FLUX.1's double blocks as SD 3.5 names
    its joint blocks (``transformer.transformer_blocks.0.attn.to_q``): the single-stream
    blocks tell FLUX.1, and so does FLUX.1's width in a file of double blocks only; SD 3.5's
    own widths stay SD 3.5's."""
    from diffusers import FluxPipeline
    from peft import get_peft_model_state_dict

    tr = build_flux_components()["transformer"]
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4.0, target_modules=[
        "to_q", "to_k", "to_v", "to_out.0"]), tr)
    randomize(tr)
    FluxPipeline.save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(tr))
    report = inspect(InspectOptions(path=str(tmp_path / "pytorch_lora_weights.safetensors")))
    assert report.family == "flux1", report.family_reason
    assert "single-stream blocks" in report.family_reason

    def double_only(width: int):
        path = tmp_path / f"double_{width}.safetensors"
        save_file({"transformer.transformer_blocks.0.attn.to_q.lora_A.weight":
                   torch.randn(4, width),
                   "transformer.transformer_blocks.0.attn.to_q.lora_B.weight":
                   torch.randn(width, 4)}, str(path))
        return inspect(InspectOptions(path=str(path))).family

    assert double_only(3072) == "flux1"
    assert double_only(2432) == double_only(1536) == "sd3"
