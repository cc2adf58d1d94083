"""SDXL LoRA files use the names sd-scripts writes: the UNet's modules by the original SGM layout
(``lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q``), the encoders as lora_te1/2.

The expected names are derived here from the SGM layout of SDXL's UNet (input_blocks 4, 5, 7 and
8, middle_block 1 and output_blocks 0-5 hold the transformers), not from the export code.
"""

import torch

from trainer.config.files import from_dict
from trainer.export.lora import kohya_state_dict, sgm_unet_names
from trainer.families.sd.tiny import build_sdxl_components
from trainer.methods.lora import unet_lora_config

# SDXL's attention blocks: diffusers' path -> the SGM layout's
SGM_ATTENTIONS = {
    "down_blocks.1.attentions.0": "input_blocks.4.1",
    "down_blocks.1.attentions.1": "input_blocks.5.1",
    "down_blocks.2.attentions.0": "input_blocks.7.1",
    "down_blocks.2.attentions.1": "input_blocks.8.1",
    "mid_block.attentions.0": "middle_block.1",
    **{f"up_blocks.0.attentions.{j}": f"output_blocks.{j}.1" for j in range(3)},
    **{f"up_blocks.1.attentions.{j}": f"output_blocks.{3 + j}.1" for j in range(3)},
}
LINEARS_IN_A_TRANSFORMER_BLOCK = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                  "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
                                  "ff.net.0.proj", "ff.net.2"]


def expected_unet_names(unet) -> set[str]:
    names = set()
    for diffusers_path, sgm_path in SGM_ATTENTIONS.items():
        block = unet.get_submodule(diffusers_path)
        inner = ["proj_in", "proj_out"] + [
            f"transformer_blocks.{k}.{linear}" for k in range(len(block.transformer_blocks))
            for linear in LINEARS_IN_A_TRANSFORMER_BLOCK]
        names |= {"lora_unet_" + f"{sgm_path}.{name}".replace(".", "_") for name in inner}
    return names


def test_sdxl_unet_and_encoder_names_are_sd_scripts_names():
    from peft import inject_adapter_in_model

    from trainer.methods.lora import text_encoder_lora_config

    parts = build_sdxl_components()
    unet, te1, te2 = parts["unet"], parts["text_encoder"], parts["text_encoder_2"]
    cfg = from_dict({"network": {"network_dim": 2, "network_alpha": 1.0}})
    unet.add_adapter(unet_lora_config(cfg))
    inject_adapter_in_model(text_encoder_lora_config(cfg), te1)
    inject_adapter_in_model(text_encoder_lora_config(cfg), te2)
    sd = kohya_state_dict(unet, te1, te_prefix="lora_te1", text_encoder_2=te2,
                          unet_rename=sgm_unet_names(unet), dtype=torch.float32)
    modules = {k.split(".")[0] for k in sd}
    assert {m for m in modules if m.startswith("lora_unet_")} == expected_unet_names(unet)
    layers = range(te1.config.num_hidden_layers)
    for prefix in ("lora_te1", "lora_te2"):
        expected = {f"{prefix}_text_model_encoder_layers_{i}_{name}" for i in layers
                    for name in ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj",
                                 "self_attn_out_proj", "mlp_fc1", "mlp_fc2")}
        assert {m for m in modules if m.startswith(prefix + "_")} == expected


def test_either_or_both_sdxl_text_encoders_train_at_their_own_rates():
    from types import SimpleNamespace

    from trainer.methods.lora import LoraMethod

    model = SimpleNamespace(version="sdxl", text_encoder="te1", text_encoder_2="te2",
                            tokenizer=None, tokenizer_2=None)

    def plan(**network):
        cfg = from_dict({"model": {"model_version": "sdxl"}, "network": network,
                         "optimizer": {"learning_rate": 1e-4, "text_encoder_lr": 5e-5,
                                       "text_encoder_2_lr": 2e-5}})
        return [(name, lr) for name, _, lr in LoraMethod(cfg).trained_text_encoders(model)]

    assert plan(train_text_encoder=True) == [("text_encoder", 5e-5), ("text_encoder_2", 2e-5)]
    assert plan(train_text_encoder=False, train_text_encoder_2=True) == [("text_encoder_2", 2e-5)]
    assert plan(train_text_encoder=True, train_text_encoder_2=False) == [("text_encoder", 5e-5)]
    assert plan() == []
