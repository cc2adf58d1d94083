"""Extracting a LoRA from a DreamBooth model of this studio and its tiny base model.

References: the weights of both models as diffusers loads them (the base folder, the DreamBooth
output's diffusers folder), numpy's SVD of each difference, and diffusers' ``load_lora_weights``
for the extracted file.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.export.hashes import precalculate_hashes
from trainer.tools.extract import extract
from trainer.tools.options import ExtractOptions

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
           "ff.net.2"]  # the layers of the UNet's transformer blocks that LoRA trains
TE_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]


@pytest.fixture(scope="module")
def dreambooth(tmp_path_factory, tiny_model_dir):
    """A DreamBooth run on the tiny model, text encoder trained too: (single file, folder)."""
    from trainer.run.loop import run

    root = tmp_path_factory.mktemp("db")
    data = one_image_dataset(root / "data")
    cfg = small_config(root, data, mode="dreambooth", optimizer={"learning_rate": 1e-3},
                       network={"train_text_encoder": True}, saving={"output_name": "db"})
    result = run(cfg)
    assert result.status == "finished", result.error
    return root / "out" / "db.safetensors", root / "out" / "db"


def pipelines(tiny_model_dir, tuned_dir):
    from diffusers import StableDiffusionPipeline

    return (StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True),
            StableDiffusionPipeline.from_pretrained(tuned_dir, local_files_only=True))


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def targets(model, names=TARGETS):
    return {name: m for name, m in model.named_modules()
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
            and any(name == t or name.endswith("." + t) for t in names)}


def test_full_rank_reproduces_the_difference(dreambooth, tiny_model_dir, tmp_path):
    single, folder = dreambooth
    out = tmp_path / "full.safetensors"
    report = extract(ExtractOptions(base=str(tiny_model_dir), tuned=str(single),
                                    save_to=str(out), rank=4096, precision="fp32",
                                    config_dir=str(tiny_model_dir)))
    base, tuned = pipelines(tiny_model_dir, folder)
    tensors, meta = read(out)
    tuned_layers = targets(tuned.unet)
    for path, layer in targets(base.unet).items():
        name = "lora_unet_" + path.replace(".", "_")
        up = tensors[f"{name}.lora_up.weight"].double().flatten(1)
        down = tensors[f"{name}.lora_down.weight"].double()
        assert float(tensors[f"{name}.alpha"]) == 4096  # the rank asked for
        diff = tuned_layers[path].weight.double() - layer.weight.double()
        assert diff.abs().max() > 0  # DreamBooth changed it
        got = (up @ down.flatten(1) * 4096 / down.shape[0]).reshape(diff.shape)
        torch.testing.assert_close(got, diff, atol=1e-6, rtol=0)
    assert len(report.modules) == len(targets(base.unet))  # the text encoder barely moved:
    assert report.skipped and report.skipped[0].startswith("te: largest change")
    assert not any(k.startswith("lora_te_") for k in tensors)
    model_hash, _ = precalculate_hashes(tensors, meta)
    assert meta["sshs_model_hash"] == model_hash
    assert meta["ss_base_model_version"] == "sd_v1" and meta["ss_network_module"] == \
        "networks.lora"
    assert meta["modelspec.architecture"] == "stable-diffusion-v1/lora"


def test_diffusers_loads_it_as_the_tuned_layers(dreambooth, tiny_model_dir, tmp_path):
    """base + extracted LoRA == base with its LoRA layers taken from the tuned model."""
    out = tmp_path / "lora.safetensors"
    extract(ExtractOptions(base=str(tiny_model_dir), tuned=str(dreambooth[1]),
                           save_to=str(out), rank=4096, precision="fp32", min_diff=0))
    base, tuned = pipelines(tiny_model_dir, dreambooth[1])
    reference, _ = pipelines(tiny_model_dir, dreambooth[1])
    with torch.no_grad():
        for path, layer in targets(reference.unet).items():
            layer.weight.copy_(targets(tuned.unet)[path].weight)
        for path, layer in targets(reference.text_encoder, TE_TARGETS).items():
            layer.weight.copy_(targets(tuned.text_encoder, TE_TARGETS)[path].weight)
    base.load_lora_weights(str(out))
    gen = torch.Generator().manual_seed(0)
    sample, hidden = torch.randn(1, 4, 16, 16, generator=gen), torch.randn(1, 77, 32,
                                                                           generator=gen)
    ids = base.tokenizer(["a red circle"], padding="max_length", max_length=77,
                         return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(base.unet(sample, 10, hidden).sample,
                                   reference.unet(sample, 10, hidden).sample, atol=1e-4, rtol=0)
        torch.testing.assert_close(base.text_encoder(ids)[0], reference.text_encoder(ids)[0],
                                   atol=1e-4, rtol=0)


def test_lower_rank_keeps_the_leading_singular_values(dreambooth, tiny_model_dir, tmp_path):
    out = tmp_path / "r2.safetensors"
    report = extract(ExtractOptions(base=str(tiny_model_dir), tuned=str(dreambooth[1]),
                                    save_to=str(out), rank=2, conv_rank=3, precision="fp32"))
    base, tuned = pipelines(tiny_model_dir, dreambooth[1])
    tensors, meta = read(out)
    kept = {m.name: m.fro_kept for m in report.modules}
    for path, layer in targets(base.unet).items():
        name = "lora_unet_" + path.replace(".", "_")
        diff = (targets(tuned.unet)[path].weight - layer.weight).detach().double().flatten(1)
        diff = diff.numpy()
        s = np.linalg.svd(diff, compute_uv=False)
        up = tensors[f"{name}.lora_up.weight"].double().flatten(1).numpy()
        down = tensors[f"{name}.lora_down.weight"].double().flatten(1).numpy()
        assert np.linalg.norm(diff - up @ down) == pytest.approx(
            np.sqrt((s[2:] ** 2).sum()), rel=1e-3, abs=1e-7)
        assert kept[name] == pytest.approx(np.sqrt((s[:2] ** 2).sum() / (s ** 2).sum()),
                                           rel=1e-4)
    conv = tensors["lora_unet_down_blocks_0_resnets_0_conv1.lora_down.weight"]
    assert conv.shape == (3, 32, 3, 3)  # the LoCon layers at conv_rank
    assert meta["ss_network_dim"] == "2" and meta["ss_network_alpha"] == "2.0"
    assert meta["ss_network_args"] == '{"conv_dim": "3", "conv_alpha": "3.0"}'


def test_clamping_bounds_the_factors(dreambooth, tiny_model_dir, tmp_path):
    plain, clamped = tmp_path / "plain.safetensors", tmp_path / "clamped.safetensors"
    for path, q in ((plain, None), (clamped, 0.9)):
        extract(ExtractOptions(base=str(tiny_model_dir), tuned=str(dreambooth[1]),
                               save_to=str(path), rank=4, clamp_quantile=q, precision="fp32"))
    a, b = read(plain)[0], read(clamped)[0]
    key = "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight"
    values = torch.cat([a[key].flatten(), a[key.replace("up", "down")].flatten()])
    bound = torch.quantile(values, 0.9)
    assert b[key].abs().max() <= bound + 1e-7 < a[key].abs().max()
