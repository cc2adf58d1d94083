"""kohya LoRA export: a peft LoRA saved by us loads unchanged into diffusers and computes the same.

The LoRA weights are randomized (peft starts lora_B at zero, which would make any file "work"),
alpha differs from the rank (diffusers' own kohya converter writes alpha = rank, which this
catches), and the conv LoRA has its own rank and alpha through peft's rank/alpha patterns.
"""

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from safetensors import safe_open
from safetensors.torch import load_file

from trainer.config import TrainConfig
from trainer.export.lora import (
    kohya_module_name,
    kohya_state_dict,
    save_lora,
    text_encoder_module_path,
)
from trainer.export.metadata import RunFacts
from trainer.families.sd.tiny import build_components

UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
                "ff.net.2"]
CONV_TARGETS = ["conv1", "conv2", "conv_shortcut", "downsamplers.0.conv", "upsamplers.0.conv"]
TE_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
RANK, ALPHA, CONV_RANK, CONV_ALPHA = 4, 2.0, 2, 3.0


def adapted_models(conv=True, seed=1):
    """Tiny UNet + text encoder with random LoRA weights (alpha != rank)."""
    comps = build_components()
    unet, te = comps["unet"], comps["text_encoder"]
    targets = UNET_TARGETS + (CONV_TARGETS if conv else [])
    unet.add_adapter(LoraConfig(
        r=RANK, lora_alpha=ALPHA, init_lora_weights="gaussian", target_modules=targets,
        lora_dropout=0.0, rank_pattern={n: CONV_RANK for n in CONV_TARGETS} if conv else {},
        alpha_pattern={n: CONV_ALPHA for n in CONV_TARGETS} if conv else {}))
    inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=ALPHA, init_lora_weights="gaussian",
                                       target_modules=TE_TARGETS), te)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in (unet, te):
            for name, p in module.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return comps


def fixed_inputs(tokenizer):
    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 16, 16, generator=gen)
    hidden = torch.randn(1, 77, 32, generator=gen)
    ids = tokenizer(["a photo of a red cat"], padding="max_length", max_length=77,
                    return_tensors="pt").input_ids
    return sample, hidden, ids


@torch.no_grad()
def outputs(unet, te, inputs):
    sample, hidden, ids = inputs
    return unet(sample, 10, hidden).sample, te(ids)[0]


def lora_layer_names(module):
    from peft.tuners.lora import LoraLayer

    return {n for n, m in module.named_modules() if isinstance(m, LoraLayer)}


@pytest.fixture(scope="module")
def trained():
    comps = adapted_models(conv=True)
    comps["inputs"] = fixed_inputs(comps["tokenizer"])
    comps["want"] = outputs(comps["unet"], comps["text_encoder"], comps["inputs"])
    return comps


def load_into_fresh_pipeline(model_dir, lora_file):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True)
    pipe.load_lora_weights(str(lora_file))
    return pipe


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.float16, 3e-3),
                                         (torch.bfloat16, 3e-2)])
def test_diffusers_loads_it_and_computes_the_same(trained, tiny_model_dir, tmp_path, dtype,
                                                  atol):
    from diffusers import StableDiffusionPipeline

    path = tmp_path / "lora.safetensors"
    save_lora(path, trained["unet"], trained["text_encoder"], TrainConfig(), RunFacts(), dtype)
    base = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    base_unet, base_te = outputs(base.unet, base.text_encoder, trained["inputs"])
    pipe = load_into_fresh_pipeline(tiny_model_dir, path)
    got_unet, got_te = outputs(pipe.unet, pipe.text_encoder, trained["inputs"])
    want_unet, want_te = trained["want"]

    torch.testing.assert_close(got_unet, want_unet, atol=atol, rtol=0)
    torch.testing.assert_close(got_te, want_te, atol=atol, rtol=0)
    assert (base_unet - want_unet).abs().max() > 0.5  # the LoRA does something
    assert (base_te - want_te).abs().max() > 0.5
    # every adapted module arrived (none dropped silently by the key conversion)
    assert lora_layer_names(pipe.unet) == lora_layer_names(trained["unet"])
    assert len(lora_layer_names(pipe.text_encoder)) == len(
        lora_layer_names(trained["text_encoder"]))


def test_key_names_triples_and_true_alpha(trained):
    sd = kohya_state_dict(trained["unet"], trained["text_encoder"])
    modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in sd}
    assert set(sd) == {m + s for m in modules
                       for s in (".lora_down.weight", ".lora_up.weight", ".alpha")}
    assert all(m.startswith(("lora_unet_", "lora_te_")) for m in modules)
    assert not any(m.startswith(("lora_te1_", "lora_te2_")) for m in modules)
    assert all(v.dtype == torch.float16 for v in sd.values())

    te_names = [m for m in modules if m.startswith("lora_te_")]
    assert "lora_te_text_model_encoder_layers_0_self_attn_q_proj" in te_names
    assert "lora_te_text_model_encoder_layers_1_mlp_fc2" in te_names
    assert len(te_names) == 2 * len(TE_TARGETS)
    assert "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_out_0" in modules
    assert "lora_unet_mid_block_attentions_0_transformer_blocks_0_ff_net_0_proj" in modules

    for m in modules:
        alpha = sd[m + ".alpha"]
        assert alpha.dim() == 0
        rank = sd[m + ".lora_down.weight"].shape[0]
        assert sd[m + ".lora_up.weight"].shape[1] == rank
        assert alpha.item() == (CONV_ALPHA if rank == CONV_RANK else ALPHA)


def test_conv_lora_keeps_4d_shapes(trained):
    sd = kohya_state_dict(trained["unet"], None, dtype=torch.float32)
    conv1 = "lora_unet_down_blocks_0_resnets_0_conv1"
    assert sd[conv1 + ".lora_down.weight"].shape == (CONV_RANK, 32, 3, 3)
    assert sd[conv1 + ".lora_up.weight"].shape == (32, CONV_RANK, 1, 1)
    assert sd[conv1 + ".alpha"].item() == CONV_ALPHA
    down = "lora_unet_down_blocks_0_downsamplers_0_conv"
    assert sd[down + ".lora_down.weight"].shape == (CONV_RANK, 32, 3, 3)
    proj_in = "lora_unet_down_blocks_0_attentions_0_proj_in"  # a 1x1 conv in SD 1.x
    assert sd[proj_in + ".lora_down.weight"].shape == (RANK, 32, 1, 1)
    assert not any(k.startswith("lora_te_") for k in sd)


def test_weights_are_peft_lora_a_and_b(trained):
    sd = kohya_state_dict(trained["unet"], trained["text_encoder"], dtype=torch.float32)
    layer = trained["unet"].down_blocks[0].attentions[0].transformer_blocks[0].attn2.to_k
    key = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k"
    assert torch.equal(sd[key + ".lora_down.weight"], layer.lora_A["default"].weight)
    assert torch.equal(sd[key + ".lora_up.weight"], layer.lora_B["default"].weight)


def test_saved_file_roundtrips_and_carries_metadata(trained, tmp_path):
    path = save_lora(tmp_path / "out" / "x.safetensors", trained["unet"], None, TrainConfig(),
                     RunFacts(steps=3))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.lora" and meta["ss_steps"] == "3"
    tensors = load_file(str(path))
    assert tensors.keys() == kohya_state_dict(trained["unet"]).keys()
    assert all(t.dtype == torch.float16 for t in tensors.values())  # save_precision default


def test_text_encoder_names_are_the_same_for_transformers_4_and_5():
    assert text_encoder_module_path("encoder.layers.0.mlp.fc1") == (
        "text_model.encoder.layers.0.mlp.fc1")
    assert text_encoder_module_path("text_model.encoder.layers.0.mlp.fc1") == (
        "text_model.encoder.layers.0.mlp.fc1")
    assert kohya_module_name("lora_te1", "text_model.encoder.layers.3.self_attn.out_proj") == (
        "lora_te1_text_model_encoder_layers_3_self_attn_out_proj")


def test_sdxl_prefix_is_a_parameter(trained):
    sd = kohya_state_dict(None, trained["text_encoder"], te_prefix="lora_te1")
    assert sd and all(k.startswith("lora_te1_text_model_encoder_layers_") for k in sd)


def test_refuses_a_model_without_lora():
    with pytest.raises(ValueError, match="no LoRA layers"):
        kohya_state_dict(build_components()["unet"])


def test_rslora_alpha_reproduces_the_scaling():
    lin = torch.nn.Sequential(torch.nn.Linear(8, 8))
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=2, use_rslora=True,
                                       target_modules=["0"]), lin)
    sd = kohya_state_dict(lin, None, dtype=torch.float32)
    assert sd["lora_unet_0.alpha"].item() == pytest.approx(2 / 4**0.5 * 4)  # alpha/r == scaling


def test_compiled_model_keeps_its_names(trained):
    compiled = torch.compile(trained["unet"])  # wraps only; nothing is compiled until called
    assert kohya_state_dict(compiled).keys() == kohya_state_dict(trained["unet"]).keys()
