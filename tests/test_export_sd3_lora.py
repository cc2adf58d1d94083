"""SD 3.5 LoRA export: the ``transformer.*`` form that diffusers' StableDiffusion3Pipeline and
ComfyUI both load, alpha folded into lora_B so that neither needs an alpha, checked by loading
the file in diffusers and comparing the transformer's and both CLIPs' outputs.

The tiny SD 3.5 has 2 joint blocks: block 0 with 3.5 medium's ``attn2``, block 1 the last, whose
context side is pre-only (no ``ff_context``, no ``to_add_out``). The ComfyUI names are written out
here from ComfyUI's ``mmdit_to_diffusers`` (comfy/utils.py): the diffusers paths it maps for SD3.
"""

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors.torch import load_file

from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora
from trainer.families.common.tiny_mmdit import build_sd3_components
from trainer.families.flux.lora import CLIP_TARGETS
from trainer.families.sd3.lora import sd3_state_dict, sd3_target_modules

RANK, ALPHA = 4, 2.0
COMFY_MAPPED = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                "attn.add_v_proj", "norm1_context.linear", "attn.to_add_out",
                "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "attn.to_out.0",
                "ff.net.0.proj", "ff.net.2"]


def comfy_sd3_keys(n_blocks):
    return {f"transformer.transformer_blocks.{i}.{m}" for i in range(n_blocks)
            for m in COMFY_MAPPED}


def randomize(*modules, seed=2):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in modules:
            for name, p in module.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def adapted(attn2=True):
    comps = build_sd3_components()
    tr = comps["transformer"]
    inject_adapter_in_model(LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=sd3_target_modules(tr, attn2=attn2),
        rank_pattern={"transformer_blocks.1.norm1_context.linear": 2},
        alpha_pattern={"transformer_blocks.1.norm1_context.linear": 5.0,
                       "transformer_blocks.0.ff.net.2": 1.0}), tr)
    for key in ("text_encoder", "text_encoder_2"):
        inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=CLIP_TARGETS),
                                comps[key])
    randomize(tr, comps["text_encoder"], comps["text_encoder_2"])
    return comps


def fixed_inputs():
    gen = torch.Generator().manual_seed(0)
    return {"hidden_states": torch.randn(1, 16, 8, 8, generator=gen),
            "encoder_hidden_states": torch.randn(1, 7, 96, generator=gen),
            "pooled_projections": torch.randn(1, 80, generator=gen),
            "timestep": torch.tensor([500.0])}


@torch.no_grad()
def outputs(comps):
    ids = [comps[t](["a red circle"], padding="max_length", max_length=77,
                    return_tensors="pt").input_ids for t in ("tokenizer", "tokenizer_2")]
    return (comps["transformer"](**fixed_inputs(), return_dict=False)[0],
            comps["text_encoder"](ids[0]).text_embeds,
            comps["text_encoder_2"](ids[1]).text_embeds)


def test_targets_are_the_joint_blocks_linears_that_exist():
    tr = build_sd3_components()["transformer"]
    targets = sd3_target_modules(tr)
    assert "transformer_blocks.0.attn2.to_q" in targets
    assert "transformer_blocks.1.norm1_context.linear" in targets
    assert not any(t.startswith("transformer_blocks.1.ff_context") for t in targets)
    assert not any("attn2" in t for t in sd3_target_modules(tr, attn2=False))
    assert {f"transformer.{t}" for t in sd3_target_modules(tr, attn2=False)} == (
        comfy_sd3_keys(2) - {"transformer.transformer_blocks.1.attn.to_add_out",
                             "transformer.transformer_blocks.1.ff_context.net.0.proj",
                             "transformer.transformer_blocks.1.ff_context.net.2"})
    with pytest.raises(ValueError, match="unknown SD3 LoRA parts"):
        sd3_target_modules(tr, parts=["attn_qkv"])


def test_diffusers_reproduces_the_trained_transformer_and_both_clips(tmp_path):
    from diffusers import StableDiffusion3Pipeline

    comps = adapted()
    want = outputs(comps)
    base = outputs(build_sd3_components())
    assert all((w - b).abs().max() > 1e-2 for w, b in zip(want, base))
    sd = sd3_state_dict(comps["transformer"], comps["text_encoder"], comps["text_encoder_2"],
                        dtype=torch.float32)
    path = save_flow_lora(tmp_path / "sd35.safetensors", sd, FlowLoraInfo("sd3", "5-medium"))
    pipe = StableDiffusion3Pipeline(**build_sd3_components())
    pipe.load_lora_weights(str(path))
    got = outputs({"transformer": pipe.transformer, "text_encoder": pipe.text_encoder,
                   "text_encoder_2": pipe.text_encoder_2, "tokenizer": pipe.tokenizer,
                   "tokenizer_2": pipe.tokenizer_2})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    assert set(load_file(path)) == set(sd)


def test_keys_are_the_forms_comfyui_maps_without_alpha():
    comps = adapted(attn2=False)
    sd = sd3_state_dict(comps["transformer"], comps["text_encoder"], comps["text_encoder_2"])
    modules = {k.rsplit(".", 2)[0] for k in sd}
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in sd)
    transformer = {m for m in modules if m.startswith("transformer.")}
    assert transformer and transformer <= comfy_sd3_keys(2)
    for prefix in ("text_encoder", "text_encoder_2"):  # ComfyUI's "diffusers lora" CLIP keys
        assert {m for m in modules if m.startswith(prefix + ".")} == {
            f"{prefix}.text_model.encoder.layers.{i}.{c}" for i in range(2)
            for c in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                      "self_attn.out_proj", "mlp.fc1", "mlp.fc2")}
    # alpha / r folded: lora_B @ lora_A is peft's own delta weight
    layer = comps["transformer"].transformer_blocks[1].norm1_context.linear
    key = "transformer.transformer_blocks.1.norm1_context.linear"
    delta = sd[key + ".lora_B.weight"].float() @ sd[key + ".lora_A.weight"].float()
    torch.testing.assert_close(delta, layer.get_delta_weight("default"), rtol=1e-3, atol=1e-3)
