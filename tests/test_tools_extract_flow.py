"""Extracting FLUX.1 and SD 3.5 LoRAs from fine-tuned models, in the family's file form: FLUX.1's
kohya keys on BFL's layout (fused q/k/v and linear1 block-diagonal, one rank per part), SD 3.5's
``transformer.*`` with no alpha. A fine-tune whose changes have rank <= the rank asked for is
reproduced exactly: the FLUX.1 file loaded by diffusers gives the tuned model's output; an SD
3.5 DreamBooth output extracted at full rank gives, once diffusers loads and fuses the file,
the tuned weights of every layer the LoRA covers."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from test_flow_train import MODELS, PIPELINES, flow_config, predict

from trainer.config import TrainConfig
from trainer.events import ListSink
from trainer.families.sd3.lora import sd3_target_modules
from trainer.models.loader import resolve_model_path
from trainer.run.loop import run
from trainer.tools.extract import extract, format_extract
from trainer.tools.options import ExtractOptions

CHANGED = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k",
           "transformer_blocks.0.attn.to_v", "transformer_blocks.0.attn.add_k_proj",
           "transformer_blocks.0.ff.net.2", "transformer_blocks.0.norm1.linear")
LINEAR1 = ("single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.proj_mlp")


def pipeline(family: str, folder=None):
    return PIPELINES[family].from_pretrained(folder or resolve_model_path(MODELS[family]),
                                             local_files_only=True)


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@torch.no_grad()
def tuned_flux(folder, layers=CHANGED):
    """The tiny FLUX.1 with rank-2 changes in ``layers`` and CLIP-L's first q_proj, saved."""
    pipe = pipeline("flux1")
    gen = torch.Generator().manual_seed(5)
    modules = [pipe.transformer.get_submodule(p) for p in layers]
    clip = pipe.text_encoder  # transformers 5 has no text_model level (trainer/export/names)
    clip = getattr(clip, "text_model", clip)
    modules.append(clip.get_submodule("encoder.layers.0.self_attn.q_proj"))
    for layer in modules:
        out, inp = layer.weight.shape
        layer.weight += 0.05 * torch.randn(out, 2, generator=gen) @ torch.randn(2, inp,
                                                                                 generator=gen)
    pipe.save_pretrained(folder)
    return pipe


def clip_out(encoder) -> torch.Tensor:
    with torch.no_grad():
        return encoder(torch.tensor([[0, 5, 9, 12, 3, 1]]))[0]


def test_flux_lora_of_a_low_rank_fine_tune_gives_the_tuned_output(tmp_path):
    tuned = tuned_flux(tmp_path / "tuned")
    out = tmp_path / "extracted.safetensors"
    report = extract(ExtractOptions(base=str(resolve_model_path(MODELS["flux1"])),
                                    tuned=str(tmp_path / "tuned"), save_to=str(out), rank=2,
                                    precision="fp32"))
    tensors, meta = read(out)
    qkv = "lora_unet_double_blocks_0_img_attn_qkv"
    assert tensors[f"{qkv}.lora_down.weight"].shape[0] == 6 and float(
        tensors[f"{qkv}.alpha"]) == 6.0  # 3 parts x rank 2, alpha / rank 1
    assert not any("single_blocks" in k or k.startswith("lora_te3_") for k in tensors)
    assert meta["ss_base_model_version"] == "flux1" and meta["ss_network_dim"] == "2"
    assert meta["ss_network_module"] == "networks.lora_flux"
    text = format_extract(report)
    assert "transformer" in text and "text encoder" in text and "did not change" in text
    assert any(s.startswith("te3: largest change 0") for s in report.skipped)
    pipe = pipeline("flux1")
    base_out = predict(pipe.transformer, "flux1", TrainConfig())
    pipe.load_lora_weights(str(out))
    want = predict(tuned.transformer, "flux1", TrainConfig())
    assert (want - base_out).abs().max() > 1e-3
    torch.testing.assert_close(predict(pipe.transformer, "flux1", TrainConfig()), want,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(clip_out(pipe.text_encoder), clip_out(tuned.text_encoder),
                               atol=1e-5, rtol=1e-5)


def test_flux_linear1_is_extracted_per_part_block_diagonally(tmp_path):
    """(diffusers' converter asserts FLUX.1's real linear1 sizes: checked on the tensors.)"""
    tuned = tuned_flux(tmp_path / "tuned", LINEAR1)
    out = tmp_path / "extracted.safetensors"
    extract(ExtractOptions(base=str(resolve_model_path(MODELS["flux1"])),
                           tuned=str(tmp_path / "tuned"), save_to=str(out), rank=2,
                           precision="fp32"))
    tensors, _ = read(out)
    name = "lora_unet_single_blocks_0_linear1"
    down, up = tensors[f"{name}.lora_down.weight"], tensors[f"{name}.lora_up.weight"]
    assert down.shape[0] == 8 and float(tensors[f"{name}.alpha"]) == 8.0
    base = pipeline("flux1").transformer
    parts = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
    block = "single_transformer_blocks.0."
    diff = torch.cat([tuned.transformer.get_submodule(block + p).weight
                      - base.get_submodule(block + p).weight for p in parts]).detach()
    torch.testing.assert_close(up @ down, diff, atol=1e-5, rtol=1e-5)
    start = 0
    for i, p in enumerate(parts):
        rows = base.get_submodule(block + p).weight.shape[0]
        used = (up[start:start + rows] != 0).any(0).nonzero().flatten().tolist()
        assert set(used) <= {2 * i, 2 * i + 1}  # block-diagonal: its own two columns
        start += rows


def test_sd3_lora_from_a_dreambooth_output(tmp_path):
    cfg = flow_config(tmp_path, "sd3", training={"max_train_steps": 2},
                      optimizer={"learning_rate": 1e-3})
    result = run(cfg.model_copy(update={"mode": "dreambooth"}), ListSink())
    assert result.status == "finished", result.error
    folder = result.output_path.removesuffix(".safetensors")
    out = tmp_path / "extracted.safetensors"
    report = extract(ExtractOptions(base=str(resolve_model_path(MODELS["sd3"])), tuned=folder,
                                    save_to=str(out), rank=256, precision="fp32"))
    tensors, meta = read(out)
    assert all(k.startswith("transformer.") and k.endswith((".lora_A.weight", ".lora_B.weight"))
               for k in tensors)  # the text encoders did not train: left out
    assert {s.split(":")[0] for s in report.skipped} >= {"te1", "te2"}
    assert meta["ss_base_model_version"] == "5-medium"
    tuned = pipeline("sd3", folder).transformer
    pipe = pipeline("sd3")
    pipe.load_lora_weights(str(out))
    pipe.fuse_lora()
    modules = sd3_target_modules(tuned)
    assert len(modules) == len(tensors) // 2
    for module in modules:
        got = pipe.transformer.get_submodule(module).weight
        want = tuned.get_submodule(module).weight
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5, msg=module)
    with pytest.raises(ValueError, match="conv_rank"):
        extract(ExtractOptions(base=str(resolve_model_path(MODELS["sd3"])), tuned=folder,
                               save_to=str(tmp_path / "x.safetensors"), conv_rank=4))
