"""FLUX.1 LoRA export: sd-scripts' kohya names on Black Forest Labs' layout, the fused form of
diffusers' split modules, and files that diffusers' FluxPipeline loads to the trained output.

The expected names are written out here from BFL's layout (sd-scripts' ``flux_models.py``:
``DoubleStreamBlock`` has ``img_mod.lin``, ``img_attn.qkv``, ``img_attn.proj``, ``img_mlp.0``,
``img_mlp.2`` and the ``txt_`` twins; ``SingleStreamBlock`` has ``linear1``, ``linear2``,
``modulation.lin``), not taken from the exporter. LoRA weights are random (peft starts lora_B at
zero) and alpha differs from the rank.

diffusers' kohya FLUX converter splits ``single_blocks_N_linear1`` with FLUX.1's real widths
(``dims=[3072, 3072, 3072, 12288]``, asserted), so the tiny model's linear1 cannot load there:
the round trip trains without it, and linear1's fused form is checked against peft's own
per-module updates by merging it into the BFL weight by hand.
"""

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors.torch import load_file

from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora
from trainer.families.common.tiny_mmdit import build_flux_components
from trainer.families.flux.lora import (
    CLIP_TARGETS,
    T5_TARGETS,
    flux_kohya_state_dict,
    flux_target_modules,
)

RANK, ALPHA = 4, 2.0
BFL_DOUBLE = ["img_mod.lin", "img_attn.qkv", "img_attn.proj", "img_mlp.0", "img_mlp.2",
              "txt_mod.lin", "txt_attn.qkv", "txt_attn.proj", "txt_mlp.0", "txt_mlp.2"]
BFL_SINGLE = ["linear1", "linear2", "modulation.lin"]
ALL_PARTS = ["img_attn_qkv", "img_attn_proj", "img_mlp_0", "img_mlp_2", "img_mod_lin",
             "txt_attn_qkv", "txt_attn_proj", "txt_mlp_0", "txt_mlp_2", "txt_mod_lin",
             "linear1", "linear2", "modulation_lin"]
NO_LINEAR1 = [p for p in ALL_PARTS if p != "linear1"]


def bfl_kohya_names(n_double, n_single, single=BFL_SINGLE):
    """``lora_unet_`` + the BFL module path with dots as underscores (sd-scripts' rule)."""
    paths = [f"double_blocks.{i}.{m}" for i in range(n_double) for m in BFL_DOUBLE]
    paths += [f"single_blocks.{i}.{m}" for i in range(n_single) for m in single]
    return {"lora_unet_" + p.replace(".", "_") for p in paths}


def randomize(*modules, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in modules:
            for name, p in module.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def adapted(parts, encoders=False, alpha_pattern=None):
    comps = build_flux_components()
    tr = comps["transformer"]
    inject_adapter_in_model(LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=flux_target_modules(tr, parts=parts),
        alpha_pattern=alpha_pattern or {}), tr)
    modules = [tr]
    if encoders:
        for key, targets in (("text_encoder", CLIP_TARGETS), ("text_encoder_2", T5_TARGETS)):
            inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=ALPHA,
                                               target_modules=targets), comps[key])
            modules.append(comps[key])
    randomize(*modules)
    return comps


def fixed_inputs():
    gen = torch.Generator().manual_seed(0)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(2.0), torch.arange(2.0),
                                         indexing="ij"), dim=-1).reshape(4, 3)
    return {"hidden_states": torch.randn(1, 4, 64, generator=gen),
            "encoder_hidden_states": torch.randn(1, 6, 48, generator=gen),
            "pooled_projections": torch.randn(1, 32, generator=gen),
            "timestep": torch.tensor([0.7]), "img_ids": img_ids, "txt_ids": torch.zeros(6, 3),
            "guidance": torch.tensor([1.0])}


@torch.no_grad()
def transformer_out(transformer):
    return transformer(**fixed_inputs(), return_dict=False)[0]


@torch.no_grad()
def clip_out(text_encoder, tokenizer):
    ids = tokenizer(["a red circle"], padding="max_length", max_length=77,
                    return_tensors="pt").input_ids
    return text_encoder(ids).pooler_output


def fresh_pipeline_with(lora):
    from diffusers import FluxPipeline

    pipe = FluxPipeline(**build_flux_components())
    pipe.load_lora_weights(lora)
    return pipe


def test_target_modules_pick_the_blocks_sd_scripts_trains():
    tr = build_flux_components()["transformer"]
    double = flux_target_modules(tr, "double")
    single = flux_target_modules(tr, "single")
    assert set(flux_target_modules(tr)) == set(double) | set(single)
    assert all(m.startswith("transformer_blocks.") for m in double) and len(double) == 14
    assert set(single) == {f"single_transformer_blocks.0.{m}" for m in
                           ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out",
                            "norm.linear")}
    assert not any("embed" in m or m in ("proj_out", "norm_out.linear")
                   for m in flux_target_modules(tr))
    with pytest.raises(ValueError, match="train_blocks"):
        flux_target_modules(tr, "both")
    with pytest.raises(ValueError, match="unknown FLUX.1 LoRA parts"):
        flux_target_modules(tr, parts=["qkv"])


def test_keys_are_sd_scripts_names_on_the_bfl_layout():
    comps = adapted(ALL_PARTS, encoders=True)
    sd = flux_kohya_state_dict(comps["transformer"], comps["text_encoder"],
                               comps["text_encoder_2"], dtype=torch.float32)
    unet = {k.split(".")[0] for k in sd if k.startswith("lora_unet_")}
    assert unet == bfl_kohya_names(1, 1)
    for name in unet:
        assert {f"{name}.lora_down.weight", f"{name}.lora_up.weight", f"{name}.alpha"} <= set(sd)
    hidden = 32
    assert sd["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"].shape == (
        3 * hidden, 3 * RANK)
    assert sd["lora_unet_double_blocks_0_img_attn_qkv.alpha"].item() == 3 * ALPHA
    assert sd["lora_unet_single_blocks_0_linear1.lora_up.weight"].shape == (
        3 * hidden + 4 * hidden, 4 * RANK)
    assert sd["lora_unet_single_blocks_0_linear1.alpha"].item() == 4 * ALPHA
    assert sd["lora_unet_double_blocks_0_img_mlp_0.alpha"].item() == ALPHA
    te1 = {k.split(".")[0] for k in sd if k.startswith("lora_te1_")}
    assert te1 == {f"lora_te1_text_model_encoder_layers_{i}_{m}" for i in range(2)
                   for m in ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj",
                             "self_attn_out_proj", "mlp_fc1", "mlp_fc2")}
    # T5 under sd-scripts' lora_te3_ and the T5 state-dict paths ComfyUI maps it from
    te3 = {k.split(".")[0] for k in sd if k.startswith("lora_te3_")}
    t5 = [f"encoder.block.{i}.layer.0.SelfAttention.{m}" for i in range(2) for m in "qkvo"]
    t5 += [f"encoder.block.{i}.layer.1.DenseReluDense.{m}" for i in range(2)
           for m in ("wi_0", "wi_1", "wo")]
    assert te3 == {"lora_te3_" + p.replace(".", "_") for p in t5}


def test_fused_linear1_is_the_split_modules_update_in_the_bfl_weight():
    comps = adapted(["linear1"], alpha_pattern={"single_transformer_blocks.0.proj_mlp": 3.0})
    tr = comps["transformer"]
    sd = flux_kohya_state_dict(tr, dtype=torch.float32)
    key = "lora_unet_single_blocks_0_linear1"
    down, up = sd[f"{key}.lora_down.weight"], sd[f"{key}.lora_up.weight"]
    scale = sd[f"{key}.alpha"].item() / down.shape[0]
    block = tr.single_transformer_blocks[0]
    parts = [block.attn.to_q, block.attn.to_k, block.attn.to_v, block.proj_mlp]
    base = torch.cat([p.base_layer.weight for p in parts])  # BFL's linear1.weight
    merged = torch.cat([p.base_layer.weight + p.get_delta_weight("default") for p in parts])
    torch.testing.assert_close(base + up @ down * scale, merged, rtol=0, atol=1e-6)


def test_diffusers_reproduces_the_trained_transformer_and_clip(tmp_path):
    comps = adapted(NO_LINEAR1, encoders=True,
                    alpha_pattern={"transformer_blocks.0.attn.to_k": 8.0})
    want = transformer_out(comps["transformer"])
    want_te = clip_out(comps["text_encoder"], comps["tokenizer"])
    base = transformer_out(build_flux_components()["transformer"])
    assert (want - base).abs().max() > 1e-2  # the LoRA changes the output
    sd = flux_kohya_state_dict(comps["transformer"], comps["text_encoder"],
                               comps["text_encoder_2"], dtype=torch.float32)
    path = save_flow_lora(tmp_path / "flux.safetensors", sd, FlowLoraInfo("flux1", "dev"))
    pipe = fresh_pipeline_with(str(path))
    torch.testing.assert_close(transformer_out(pipe.transformer), want, rtol=0, atol=1e-5)
    torch.testing.assert_close(clip_out(pipe.text_encoder, pipe.tokenizer), want_te,
                               rtol=0, atol=1e-5)
    assert any(k.startswith("lora_te3_") for k in load_file(path))  # written for ComfyUI
    assert not any("lora" in n for n, _ in pipe.text_encoder_2.named_parameters())


def test_single_blocks_only_round_trip_in_fp16_file(tmp_path):
    comps = adapted(["linear2", "modulation_lin"])
    want = transformer_out(comps["transformer"])
    sd = flux_kohya_state_dict(comps["transformer"])
    assert {k.split(".")[0] for k in sd} == {"lora_unet_single_blocks_0_linear2",
                                             "lora_unet_single_blocks_0_modulation_lin"}
    assert all(t.dtype == torch.float16 for t in sd.values())
    pipe = fresh_pipeline_with(dict(sd))
    torch.testing.assert_close(transformer_out(pipe.transformer).float(), want,
                               rtol=0, atol=1e-2)


def test_a_lora_outside_the_bfl_map_is_refused():
    comps = build_flux_components()
    tr = comps["transformer"]
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["proj_out"]), tr)
    with pytest.raises(ValueError, match="no name in the FLUX.1"):
        flux_kohya_state_dict(tr)
