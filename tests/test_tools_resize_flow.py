"""Resizing FLUX.1 and SD 3.5 LoRA files: the result stays in the family's form (FLUX.1: kohya
keys on the BFL layout, fused q/k/v and linear1 block-diagonal with one rank per part; SD 3.5:
``transformer.*`` with alpha folded into lora_B), loads in the family's diffusers pipeline and
gives, at the same rank, the original file's output, and at a lower rank each layer's update
truncated to that rank.

The references come from the input files' tensors with numpy (update = up @ down * alpha /
rank, a part's rows of a fused update, its SVD), and the results are read through diffusers'
own loaders (``load_lora_weights``, ``fuse_lora``), not through our reader.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flow_helpers import flux_lora_file, sd3_lora_file
from safetensors import safe_open
from test_flow_train import MODELS, PIPELINES, predict

from trainer.config import TrainConfig
from trainer.models.loader import resolve_model_path
from trainer.tools.inspect import inspect
from trainer.tools.options import InspectOptions, ResizeOptions
from trainer.tools.resize import format_resize, resize


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def pipeline(family: str):
    return PIPELINES[family].from_pretrained(resolve_model_path(MODELS[family]),
                                             local_files_only=True)


def output_with(family: str, lora) -> torch.Tensor:
    pipe = pipeline(family)
    pipe.load_lora_weights(str(lora))
    return predict(pipe.transformer, family, TrainConfig())


def fused_deltas(family: str, lora, modules: list[str]) -> dict[str, np.ndarray]:
    """Each transformer module's weight change once diffusers loads and fuses ``lora``."""
    pipe = pipeline(family)
    layer = pipe.transformer.get_submodule
    before = {m: layer(m).weight.detach().clone() for m in modules}
    pipe.load_lora_weights(str(lora))
    pipe.fuse_lora()
    return {m: (layer(m).weight.detach() - before[m]).double().numpy() for m in modules}


def truncated(delta: np.ndarray, k: int) -> np.ndarray:
    u, s, vh = np.linalg.svd(delta, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k]


def kohya_update(tensors, name: str) -> np.ndarray:
    down = tensors[f"{name}.lora_down.weight"].double().numpy()
    up = tensors[f"{name}.lora_up.weight"].double().numpy()
    return up @ down * float(tensors[f"{name}.alpha"]) / down.shape[0]


@pytest.fixture(scope="module")
def flux_file(tmp_path_factory):
    return flux_lora_file(tmp_path_factory.mktemp("flux") / "flux.safetensors")


@pytest.fixture(scope="module")
def flux_linear1_file(tmp_path_factory):
    return flux_lora_file(tmp_path_factory.mktemp("flux1") / "flux.safetensors", linear1=True)


@pytest.fixture(scope="module")
def sd3_file(tmp_path_factory):
    return sd3_lora_file(tmp_path_factory.mktemp("sd3") / "sd3.safetensors")


def test_flux_same_rank_keeps_the_form_and_the_output(flux_file, tmp_path):
    out = tmp_path / "same.safetensors"
    report = resize(ResizeOptions(path=str(flux_file), save_to=str(out), rank=4))
    (before, _), (after, meta) = read(flux_file), read(out)
    assert set(after) == set(before)  # the same kohya BFL keys, alphas included
    qkv = "lora_unet_double_blocks_0_img_attn_qkv"
    assert after[f"{qkv}.lora_down.weight"].shape[0] == 12  # 3 parts x rank 4
    assert float(after[f"{qkv}.alpha"]) == pytest.approx(6.0)  # alpha / rank 0.5 kept
    assert after["lora_unet_single_blocks_0_linear2.lora_down.weight"].shape[0] == 4
    fused = {m.name: m for m in report.modules}[qkv]
    assert (fused.parts, fused.old_rank, fused.new_rank) == (3, 4, 4)
    assert meta["ss_base_model_version"] == "flux1" and meta["ss_network_dim"] == "4"
    assert meta["ss_network_alpha"] == "2.0"
    assert "4->4 x3" in format_resize(report)
    assert inspect(InspectOptions(path=str(out))).family == "flux1"
    torch.testing.assert_close(output_with("flux1", out), output_with("flux1", flux_file),
                               atol=1e-5, rtol=1e-5)


def test_flux_lower_rank_truncates_each_part(flux_file, tmp_path):
    out = tmp_path / "low.safetensors"
    resize(ResizeOptions(path=str(flux_file), save_to=str(out), rank=2))
    original, _ = read(flux_file)
    after, meta = read(out)
    assert after["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"].shape[0] == 6
    assert float(after["lora_unet_double_blocks_0_img_attn_qkv.alpha"]) == pytest.approx(3.0)
    assert meta["ss_network_dim"] == "2" and meta["ss_network_alpha"] == "1.0"
    # the diffusers modules of the file's BFL modules: a fused update's rows are q, k, v
    qkv = kohya_update(original, "lora_unet_double_blocks_0_txt_attn_qkv")
    h = qkv.shape[1]
    expected = {
        "transformer_blocks.0.attn.add_q_proj": qkv[:h],
        "transformer_blocks.0.attn.add_v_proj": qkv[2 * h:],
        "transformer_blocks.0.norm1.linear":
            kohya_update(original, "lora_unet_double_blocks_0_img_mod_lin"),
        "single_transformer_blocks.0.proj_out":
            kohya_update(original, "lora_unet_single_blocks_0_linear2"),
    }
    got = fused_deltas("flux1", out, list(expected))
    for module, delta in expected.items():
        np.testing.assert_allclose(got[module], truncated(delta, 2), atol=2e-5, rtol=0,
                                   err_msg=module)


def test_flux_linear1_is_resized_in_its_four_parts(flux_linear1_file, tmp_path):
    """linear1 (q, k, v of the block's width, then the MLP's input): block-diagonal again with
    rank 2 per part, each part's update the truncation of its rows. (diffusers' converter
    asserts FLUX.1's real linear1 sizes, so the tiny file is checked on its tensors.)"""
    out = tmp_path / "low.safetensors"
    resize(ResizeOptions(path=str(flux_linear1_file), save_to=str(out), rank=2))
    (original, _), (after, _) = read(flux_linear1_file), read(out)
    name = "lora_unet_single_blocks_0_linear1"
    before, now = kohya_update(original, name), kohya_update(after, name)
    h = before.shape[1]
    up = after[f"{name}.lora_up.weight"]
    assert up.shape[1] == 8 and float(after[f"{name}.alpha"]) == pytest.approx(4.0)
    for i, rows in enumerate((slice(0, h), slice(h, 2 * h), slice(2 * h, 3 * h),
                              slice(3 * h, None))):
        cols = (up[rows] != 0).any(0).nonzero().flatten().tolist()
        assert cols == [2 * i, 2 * i + 1]  # block-diagonal: part i uses its 2 columns only
        np.testing.assert_allclose(now[rows], truncated(before[rows], 2), atol=2e-5, rtol=0)


def test_sd3_keeps_the_transformer_form_with_alpha_folded(sd3_file, tmp_path):
    out = tmp_path / "same.safetensors"
    resize(ResizeOptions(path=str(sd3_file), save_to=str(out), rank=4))
    (before, _), (after, meta) = read(sd3_file), read(out)
    assert set(after) == set(before)  # transformer.* / text_encoder(_2).*, no alpha
    assert not any(k.endswith(".alpha") for k in after)
    assert meta["ss_base_model_version"] == "5-medium" and meta["ss_network_dim"] == "4"
    torch.testing.assert_close(output_with("sd3", out), output_with("sd3", sd3_file),
                               atol=1e-5, rtol=1e-5)

    low = tmp_path / "low.safetensors"
    resize(ResizeOptions(path=str(sd3_file), save_to=str(low), rank=2))
    resized, _ = read(low)
    modules = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn2.to_v",
               "transformer_blocks.1.norm1_context.linear"]
    got = fused_deltas("sd3", low, modules)
    for module in modules:
        key = f"transformer.{module}"
        assert resized[f"{key}.lora_A.weight"].shape[0] == 2
        delta = (before[f"{key}.lora_B.weight"].double() @ before[f"{key}.lora_A.weight"]
                 .double()).numpy()  # the trainer folded alpha / rank into lora_B
        np.testing.assert_allclose(got[module], truncated(delta, 2), atol=2e-5, rtol=0,
                                   err_msg=module)
