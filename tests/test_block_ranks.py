"""Block-wise ranks of a file in inspect (and so the Utilities tab): the UNet blocks as
sd-scripts' networks/lora.py numbers them, worked out by hand for a few module names, and a
2-step run with block_dims whose file shows each block at the rank it was given."""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from train_helpers import one_image_dataset, small_config

from trainer.tools.inspect import format_inspect, inspect
from trainer.tools.options import InspectOptions


def lora(tensors: dict, name: str, rank: int, alpha: float, shape=(32, 32)) -> None:
    out, inp = shape[0], shape[1]
    kernel = shape[2:]
    tensors[f"{name}.lora_down.weight"] = torch.randn(rank, inp, *kernel)
    tensors[f"{name}.lora_up.weight"] = torch.randn(out, rank, *((1, 1) if kernel else ()))
    tensors[f"{name}.alpha"] = torch.tensor(alpha)


def test_sd1_blocks_as_sd_scripts_counts_them(tmp_path):
    t: dict = {}
    # down_blocks_i_{resnets,attentions}_j -> 1 + 3i + j, downsamplers 1 + 3i + 2; mid 12;
    # up_blocks_i_..._j -> 13 + 3i + j (sd-scripts' get_block_index, by hand)
    lora(t, "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q", 8, 4)  # 4
    lora(t, "lora_unet_down_blocks_1_attentions_0_proj_in", 8, 4)  # 4
    lora(t, "lora_unet_down_blocks_0_downsamplers_0_conv", 2, 1, (32, 32, 3, 3))  # 3, conv
    lora(t, "lora_unet_mid_block_attentions_0_proj_out", 16, 16)  # 12
    lora(t, "lora_unet_up_blocks_3_attentions_2_proj_out", 4, 2)  # 13 + 9 + 2 = 24
    lora(t, "lora_te_text_model_encoder_layers_0_self_attn_q_proj", 8, 8)  # no block
    path = tmp_path / "blocks.safetensors"
    save_file(t, str(path), metadata={"ss_base_model_version": "sd_v1"})
    report = inspect(InspectOptions(path=str(path)))
    got = [(b.index, b.label, b.modules, b.ranks, b.alphas, b.conv_ranks) for b in report.blocks]
    assert got == [(3, "IN03", 1, [], [], [2]), (4, "IN04", 2, [8], [4.0], []),
                   (12, "M00", 1, [16], [16.0], []), (24, "OUT11", 1, [4], [2.0], [])]
    text = format_inspect(report)
    assert "- 4 IN04: rank 8, alpha 4 (2 modules)" in text
    assert "- 3 IN03: conv rank 2, conv alpha 1 (1 module)" in text
    dims = ["0"] * 25
    dims[4], dims[12], dims[24] = "8", "16", "4"
    conv = ["0"] * 25
    conv[3] = "2"
    assert f"block_dims = [{','.join(dims)}]" in text
    assert f"conv_block_dims = [{','.join(conv)}]" in text


def test_sdxl_blocks_on_the_sgm_names(tmp_path):
    t: dict = {}
    # SDXL: input_blocks_n -> 1 + n, middle_block_n -> 10 + n, output_blocks_n -> 13 + n
    lora(t, "lora_unet_input_blocks_4_1_transformer_blocks_0_attn2_to_k", 4, 4)  # 5: IN04
    lora(t, "lora_unet_middle_block_1_proj_in", 8, 4)  # 11: M01
    lora(t, "lora_unet_output_blocks_0_1_proj_out", 2, 2)  # 13: OUT00
    lora(t, "lora_unet_output_blocks_0_1_proj_in", 4, 2)  # the same block, another rank
    path = tmp_path / "xl.safetensors"
    save_file(t, str(path), metadata={"ss_base_model_version": "sdxl_base_v1-0"})
    report = inspect(InspectOptions(path=str(path)))
    assert [(b.index, b.label, sorted(b.ranks)) for b in report.blocks] == [
        (5, "IN04", [4]), (11, "M01", [8]), (13, "OUT00", [2, 4])]
    text = format_inspect(report)
    assert "- 13 OUT00: rank 2/4, alpha 2 (2 modules)" in text
    assert "block_dims =" not in text  # a block of two ranks has no sd-scripts list


def test_a_block_dims_run_shows_its_ranks(tmp_path):
    from trainer.run.loop import run

    dims = [(i % 4) + 1 for i in range(25)]
    alphas = [float(d) / 2 for d in dims]
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       training={"max_train_steps": 2},
                       network={"block_dims": dims, "block_alphas": alphas})
    result = run(cfg)
    assert result.status == "finished", result.error
    report = inspect(InspectOptions(path=result.output_path))
    assert report.family == "sd1" and len(report.blocks) > 3
    for b in report.blocks:  # every block that has a LoRA, at the rank the config gave it
        assert (b.ranks, b.alphas) == ([dims[b.index]], [alphas[b.index]]), b
    text = format_inspect(report)
    shown = text.split("block_dims = [")[1].split("]")[0].split(",")
    present = {b.index for b in report.blocks}
    assert [int(x) for x in shown] == [d if i in present else 0 for i, d in enumerate(dims)]
