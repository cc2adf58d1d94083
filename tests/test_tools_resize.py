"""Resizing a LoRA by SVD: the same rank gives the same update, a lower rank loses exactly the
discarded singular values (Eckart-Young-Mirsky), the dynamic methods pick the smallest rank
that meets their target, and the file's metadata and hashes follow.

The references are computed here from the files' tensors with numpy: update = up @ down *
alpha / rank per module (the kohya LoRA definition), its singular values by numpy.linalg.svd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tools_helpers import lora_pair, random_lora, sd_scripts_metadata

from trainer.export.hashes import precalculate_hashes
from trainer.tools.options import OptionsError, ResizeOptions, validate
from trainer.tools.resize import resize
from trainer.tools.svd import choose_rank


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def updates(tensors) -> dict[str, np.ndarray]:
    """Module -> its update as a 2-D float64 matrix, straight from the kohya definition."""
    out = {}
    for key in tensors:
        if key.endswith(".lora_down.weight"):
            name = key[: -len(".lora_down.weight")]
            down = tensors[key].double().flatten(1).numpy()
            up = tensors[f"{name}.lora_up.weight"].double().flatten(1).numpy()
            alpha = float(tensors[f"{name}.alpha"])
            out[name] = up @ down * alpha / down.shape[0]
    return out


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    return random_lora(tmp_path_factory.mktemp("resize") / "in.safetensors", seed=3, rank=6,
                       alpha=3.0, conv=True)


def test_same_rank_reproduces_the_update(lora, tmp_path):
    out = tmp_path / "same.safetensors"
    report = resize(ResizeOptions(path=str(lora), save_to=str(out), rank=6))
    before, after = updates(read(lora)[0]), updates(read(out)[0])
    assert set(before) == set(after) and len(before) == len(report.modules)
    for name in before:
        np.testing.assert_allclose(after[name], before[name], atol=1e-5, rtol=0)
    assert all(abs(m.fro_kept - 1) < 1e-6 for m in report.modules)


def test_lower_rank_loses_the_discarded_singular_values(lora, tmp_path):
    out = tmp_path / "low.safetensors"
    report = resize(ResizeOptions(path=str(lora), save_to=str(out), rank=2, conv_rank=3))
    (original, original_meta), (tensors, meta) = read(lora), read(out)
    before, after = updates(original), updates(tensors)
    by_name = {m.name: m for m in report.modules}
    for name, delta in before.items():
        k = 3 if tensors[f"{name}.lora_down.weight"].shape[-1] == 3 else 2
        assert tensors[f"{name}.lora_down.weight"].shape[0] == k == by_name[name].new_rank
        s = np.linalg.svd(delta, compute_uv=False)
        error = np.linalg.norm(delta - after[name])
        assert error == pytest.approx(np.sqrt((s[k:] ** 2).sum()), rel=1e-4, abs=1e-6)
        kept = np.sqrt((s[:k] ** 2).sum() / (s ** 2).sum())
        assert by_name[name].fro_kept == pytest.approx(kept, rel=1e-5)
        assert by_name[name].error == pytest.approx(error, rel=1e-4, abs=1e-6)
        # the scale alpha / rank is kept: alpha follows the rank
        alpha_in = float(original[f"{name}.alpha"])
        rank_in = original[f"{name}.lora_down.weight"].shape[0]
        assert float(tensors[f"{name}.alpha"]) == pytest.approx(alpha_in / rank_in * k)
    assert meta["ss_network_dim"] == "2" and meta["ss_network_alpha"] == "1.0"
    assert meta["ss_training_comment"].startswith("rank resized from 6 to 2")
    assert meta["ss_steps"] == "7"  # the training facts stay
    model_hash, legacy = precalculate_hashes(tensors, meta)
    assert meta["sshs_model_hash"] == model_hash and meta["sshs_legacy_hash"] == legacy
    assert meta["modelspec.hash_sha256"] == "0x" + model_hash
    assert model_hash != original_meta["sshs_model_hash"]


def test_sv_fro_keeps_the_smallest_rank_that_reaches_the_target(lora, tmp_path):
    out = tmp_path / "fro.safetensors"
    report = resize(ResizeOptions(path=str(lora), save_to=str(out), rank=5,
                                  dynamic_method="sv_fro", dynamic_param=0.9))
    before, (tensors, meta) = updates(read(lora)[0]), read(out)
    ranks = {m.name: m.new_rank for m in report.modules}
    for name, delta in before.items():
        s = np.linalg.svd(delta, compute_uv=False)
        shares = np.sqrt(np.cumsum(s ** 2) / (s ** 2).sum())
        want = min(int(np.argmax(shares >= 0.9)) + 1, 5)
        assert ranks[name] == want == tensors[f"{name}.lora_down.weight"].shape[0]
    assert len(set(ranks.values())) > 1  # the ranks differ between modules
    for name, delta in before.items():  # ... yet each is the truncation of its update
        s = np.linalg.svd(delta, compute_uv=False)
        error = np.linalg.norm(delta - updates(tensors)[name])
        assert error == pytest.approx(np.sqrt((s[ranks[name]:] ** 2).sum()), rel=1e-4,
                                      abs=1e-6)
    # one alpha for all (scale 3 / 6 times the largest rank 5); a module of lower rank
    # carries the difference in its factors, which diffusers' loader needs (see resize.py)
    assert {float(t) for k, t in tensors.items() if k.endswith(".alpha")} == {2.5}
    assert meta["ss_network_dim"] == "Dynamic" and meta["ss_network_alpha"] == "2.5"


def test_the_three_dynamic_rules():
    s = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.0])
    assert choose_rank(s, 10, "sv_ratio", 4.0) == 3  # 8, 4, 2 >= 8 / 4
    assert choose_rank(s, 10, "sv_ratio", 1.0) == 1
    assert choose_rank(s, 10, "sv_cumulative", 12 / 15) == 2  # (8 + 4) / 15
    assert choose_rank(s, 10, "sv_cumulative", 0.81) == 3
    assert choose_rank(s, 10, "sv_fro", np.sqrt(80 / 85)) == 2  # sqrt(64 + 16) / sqrt(85)
    assert choose_rank(s, 2, "sv_fro", 1.0) == 2  # capped at the rank given
    assert choose_rank(s, 10, "sv_fro", 1.0) == 4  # never a zero singular value
    assert choose_rank(torch.zeros(4), 3) == 1  # a zero update becomes rank 1
    assert choose_rank(s, 3) == 3 and choose_rank(s, 9) == 5


def test_an_sd_scripts_file_resizes_with_its_metadata(tmp_path):
    """fp16 tensors, a 0-d fp16 alpha and sd-scripts' ss_* strings, as train_network.py saves."""
    from safetensors.torch import save_file

    tensors = lora_pair("lora_unet_mid_block_attentions_0_proj_in", 64, 64, 16, 8.0, 1,
                        kernel=(1, 1))
    tensors.update(lora_pair("lora_te_text_model_encoder_layers_0_mlp_fc1", 96, 48, 16, 8.0, 2))
    path = tmp_path / "sd.safetensors"
    meta = sd_scripts_metadata(ss_training_comment="my comment")
    save_file(tensors, str(path), metadata=meta)
    out = tmp_path / "sd-8.safetensors"
    resize(ResizeOptions(path=str(path), save_to=str(out), rank=8))
    got, new_meta = read(out)
    assert got["lora_unet_mid_block_attentions_0_proj_in.lora_down.weight"].shape == (8, 64, 1, 1)
    assert got["lora_unet_mid_block_attentions_0_proj_in.lora_up.weight"].shape == (64, 8, 1, 1)
    assert all(t.dtype == torch.float16 for t in got.values())  # the file's precision
    assert new_meta["ss_network_dim"] == "8" and new_meta["ss_network_alpha"] == "4.0"
    assert new_meta["ss_training_comment"] == "rank resized from 16 to 8; my comment"
    assert new_meta["ss_tag_frequency"] == meta["ss_tag_frequency"]
    assert new_meta["sshs_model_hash"] != meta["sshs_model_hash"]


def unet_output(model_dir, lora_file=None):
    from diffusers import StableDiffusionPipeline

    gen = torch.Generator().manual_seed(0)
    sample, hidden = torch.randn(1, 4, 16, 16, generator=gen), torch.randn(1, 77, 32,
                                                                           generator=gen)
    pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True)
    if lora_file is not None:
        pipe.load_lora_weights(str(lora_file))
    with torch.no_grad():
        return pipe.unet(sample, 10, hidden).sample


def test_diffusers_loads_the_resized_files(lora, tiny_model_dir, tmp_path):
    """Same rank in fp16: the output of the original; a dynamic resize: the output of the
    same file merged by the merge tool (held to diffusers on uniform files)."""
    from trainer.tools.merge import merge
    from trainer.tools.options import MergeOptions

    same, dynamic = tmp_path / "r.safetensors", tmp_path / "d.safetensors"
    resize(ResizeOptions(path=str(lora), save_to=str(same), rank=6, precision="fp16"))
    torch.testing.assert_close(unet_output(tiny_model_dir, same),
                               unet_output(tiny_model_dir, lora), atol=5e-3, rtol=0)
    resize(ResizeOptions(path=str(lora), save_to=str(dynamic), rank=6,
                         dynamic_method="sv_cumulative", dynamic_param=0.7))
    merge(MergeOptions(base=str(tiny_model_dir), loras=[str(dynamic)], precision="fp32",
                       save_folder=str(tmp_path / "merged")))
    torch.testing.assert_close(unet_output(tiny_model_dir, dynamic),
                               unet_output(tmp_path / "merged"), atol=1e-4, rtol=0)


def test_bad_options_are_named():
    with pytest.raises(OptionsError, match="dynamic_param"):
        validate(ResizeOptions, {"path": "a.safetensors", "save_to": "b.safetensors",
                                 "dynamic_method": "sv_fro"})
    with pytest.raises(OptionsError, match="ratio is >= 1"):
        validate(ResizeOptions, {"path": "a", "save_to": "b.safetensors",
                                 "dynamic_method": "sv_ratio", "dynamic_param": 0.5})
    with pytest.raises(OptionsError, match="rank"):
        validate(ResizeOptions, {"path": "a", "save_to": "b.safetensors", "rank": 0})


def test_modules_of_another_type_are_copied_as_they_are(tmp_path):
    from safetensors.torch import save_file

    tensors = lora_pair("lora_te_text_model_encoder_layers_0_mlp_fc1", 96, 48, 8, 8.0, 2)
    loha = {f"lora_unet_mid_block_attentions_0_proj_out.{k}": torch.ones(4, 4).half()
            for k in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")}
    path, out = tmp_path / "mixed.safetensors", tmp_path / "mixed-2.safetensors"
    save_file({**tensors, **loha}, str(path))
    report = resize(ResizeOptions(path=str(path), save_to=str(out), rank=2))
    assert report.kept_as_is == ["lora_unet_mid_block_attentions_0_proj_out"]
    got = read(out)[0]
    assert all(torch.equal(got[k], v) for k, v in loha.items())
    assert got["lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"].shape == (2, 48)


def test_a_tucker_locon_module_becomes_a_plain_one(tmp_path):
    """LoCon's Tucker form (1x1 down, a 3x3 core, 1x1 up) applied as three convolutions is the
    reference; the resized module is one 3x3 down and a 1x1 up."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(4)
    name = "lora_unet_down_blocks_0_resnets_0_conv1"
    down, mid = torch.randn(3, 8, 1, 1, generator=gen), torch.randn(3, 3, 3, 3, generator=gen)
    up = torch.randn(6, 3, 1, 1, generator=gen)
    path, out = tmp_path / "tucker.safetensors", tmp_path / "plain.safetensors"
    save_file({f"{name}.lora_down.weight": down, f"{name}.lora_mid.weight": mid,
               f"{name}.lora_up.weight": up, f"{name}.alpha": torch.tensor(1.5)}, str(path))
    report = resize(ResizeOptions(path=str(path), save_to=str(out), rank=8))
    got = read(out)[0]
    assert got[f"{name}.lora_down.weight"].shape == (3, 8, 3, 3) and report.modules[0].conv
    x = torch.randn(1, 8, 10, 10, generator=gen)
    conv = torch.nn.functional.conv2d
    want = conv(conv(conv(x, down), mid, padding=1), up) * 1.5 / 3
    new = got[f"{name}.lora_down.weight"]
    scale = float(got[f"{name}.alpha"]) / new.shape[0]
    have = conv(conv(x, new, padding=1), got[f"{name}.lora_up.weight"]) * scale
    torch.testing.assert_close(have, want, atol=1e-4, rtol=1e-4)
