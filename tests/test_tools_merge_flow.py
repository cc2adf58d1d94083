"""Merging FLUX.1 and SD 3.5 LoRAs into their base models: the merged diffusers folder and the
merged single file in the original layout (read back by diffusers' ``from_pretrained`` and
``from_single_file``) give what diffusers' own loader gives with the LoRA at that weight
(``load_lora_weights`` + ``set_adapters``), the reference; for FLUX.1's linear1, which diffusers'
converter cannot read at the tiny width, the merged file's BFL tensor is checked against the
base's plus the file's update; sd-scripts' SD3 names (fused qkv, the last block's swapped
modulation) merge as the ``transformer.*`` form of the same LoRA does."""

from __future__ import annotations

import pytest
import torch
from flow_helpers import flux_lora_file, scale_diffusers_flux_split, sd3_lora_file
from safetensors import safe_open
from safetensors.torch import save_file
from test_flow_train import MODELS, PIPELINES, predict

from trainer.config import TrainConfig
from trainer.families.common.mmdit_checkpoint import flux_tensors, swap_halves
from trainer.models.loader import resolve_model_path
from trainer.tools.merge import format_merge, merge
from trainer.tools.options import MergeOptions

WEIGHT = 0.7
CLASSES = {"flux1": "FluxTransformer2DModel", "sd3": "SD3Transformer2DModel"}


def pipeline(family: str, folder=None):
    return PIPELINES[family].from_pretrained(folder or resolve_model_path(MODELS[family]),
                                             local_files_only=True)


def reference(family: str, lora) -> object:
    """The base pipeline with ``lora`` loaded by diffusers at ``WEIGHT``."""
    pipe = pipeline(family)
    pipe.load_lora_weights(str(lora), adapter_name="lora")
    pipe.set_adapters(["lora"], adapter_weights=[WEIGHT])
    return pipe


def clip_out(encoder) -> torch.Tensor:
    ids = torch.tensor([[0, 5, 9, 12, 3, 1]])
    with torch.no_grad():
        return encoder(ids)[0]


def single_file_transformer(family: str, path):
    import diffusers

    cls = getattr(diffusers, CLASSES[family])
    return cls.from_single_file(str(path), subfolder="transformer", local_files_only=True,
                                config=str(resolve_model_path(MODELS[family])))


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_merged_folder_and_file_give_diffusers_loaded_lora(tmp_path, monkeypatch, family):
    make = flux_lora_file if family == "flux1" else sd3_lora_file
    lora = make(tmp_path / "lora.safetensors")
    folder, single = tmp_path / "merged", tmp_path / "merged.safetensors"
    report = merge(MergeOptions(base=str(resolve_model_path(MODELS[family])), loras=[str(lora)],
                                weights=[WEIGHT], save_folder=str(folder), save_to=str(single),
                                precision="fp32"))
    assert report.family == family and not report.loras[0].unmatched
    assert "Wrote" in format_merge(report)
    expected = reference(family, lora)
    cfg = TrainConfig()
    want = predict(expected.transformer, family, cfg)
    assert (want - predict(pipeline(family).transformer, family, cfg)).abs().max() > 1e-3
    merged = pipeline(family, folder)
    torch.testing.assert_close(predict(merged.transformer, family, cfg), want,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(clip_out(merged.text_encoder), clip_out(expected.text_encoder),
                               atol=1e-5, rtol=1e-5)
    if family == "flux1":  # diffusers' reader splits linear1 at FLUX.1's real widths
        scale_diffusers_flux_split(monkeypatch)
    torch.testing.assert_close(predict(single_file_transformer(family, single), family, cfg),
                               want, atol=1e-5, rtol=1e-5)
    with safe_open(str(single), "pt") as f:
        meta, keys = f.metadata(), list(f.keys())
    assert meta["modelspec.merged_from"] == f"{MODELS[family].split(':')[1]}, lora ({WEIGHT:g})"
    # a text encoder was merged: every component in the file, as DreamBooth writes it
    assert any(k.startswith("text_encoders.clip_l.") for k in keys)


def test_flux_linear1_adds_its_update_in_the_bfl_file(tmp_path):
    lora = flux_lora_file(tmp_path / "lora.safetensors", linear1=True)
    single = tmp_path / "merged.safetensors"
    merge(MergeOptions(base=str(resolve_model_path(MODELS["flux1"])), loras=[str(lora)],
                       weights=[WEIGHT], save_to=str(single), precision="fp32"))
    base = flux_tensors(pipeline("flux1").transformer)
    name = "lora_unet_single_blocks_0_linear1"
    with safe_open(str(lora), "pt") as f:
        down, up = f.get_tensor(f"{name}.lora_down.weight"), f.get_tensor(f"{name}.lora_up.weight")
        alpha = float(f.get_tensor(f"{name}.alpha"))
    with safe_open(str(single), "pt") as f:
        merged = f.get_tensor("model.diffusion_model.single_blocks.0.linear1.weight")
    delta = up.double() @ down.double() * alpha / down.shape[0]
    torch.testing.assert_close(merged.double(), base["single_blocks.0.linear1.weight"].double()
                               + WEIGHT * delta, atol=1e-6, rtol=1e-6)
    assert (delta.abs().max() > 1e-3) and down.shape[0] == 16  # 4 parts x rank 4


def sd_scripts_sd3(tensors: dict[str, torch.Tensor], layers: int
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The ``transformer.*`` LoRA renamed to sd-scripts' SD3 keys on Stability's layout
    (docs/flow_families_plan.md): q/k/v fused (down stacked, up block-diagonal), the last
    block's context modulation with its halves swapped; alpha = rank (the file's scale is 1).
    Also the ``transformer.*`` tensors of the same layers."""
    fused = {"x_block_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
             "x_block_attn2_qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
             "context_block_attn_qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
             "x_block_attn_proj": ("attn.to_out.0",), "x_block_mlp_fc1": ("ff.net.0.proj",),
             "context_block_adaLN_modulation_1": ("norm1_context.linear",)}
    out, same = {}, {}
    for n in range(layers):
        for part, modules in fused.items():
            keys = [f"transformer.transformer_blocks.{n}.{m}" for m in modules]
            if not all(f"{k}.lora_A.weight" in tensors for k in keys):
                continue
            same.update({f"{k}.{ab}.weight": tensors[f"{k}.{ab}.weight"] for k in keys
                         for ab in ("lora_A", "lora_B")})
            downs = [tensors[f"{k}.lora_A.weight"] for k in keys]
            up = torch.block_diag(*[tensors[f"{k}.lora_B.weight"] for k in keys])
            if part == "context_block_adaLN_modulation_1" and n == layers - 1:
                up = swap_halves(up)
            name = f"lora_unet_joint_blocks_{n}_{part}"
            out[f"{name}.lora_down.weight"] = torch.cat(downs).contiguous()
            out[f"{name}.lora_up.weight"] = up.contiguous()
            out[f"{name}.alpha"] = torch.tensor(float(up.shape[1]))
    return out, same


def test_sd_scripts_sd3_names_merge_as_the_transformer_form(tmp_path):
    lora = sd3_lora_file(tmp_path / "lora.safetensors")
    with safe_open(str(lora), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith("transformer.")}
    base = resolve_model_path(MODELS["sd3"])
    layers = pipeline("sd3").transformer.config.num_layers
    kohya, mine = sd_scripts_sd3(tensors, layers)
    assert f"lora_unet_joint_blocks_{layers - 1}_context_block_adaLN_modulation_1.alpha" in kohya
    save_file(kohya, str(tmp_path / "kohya.safetensors"))
    save_file(mine, str(tmp_path / "mine.safetensors"))
    outs = {}
    for name in ("kohya", "mine"):
        report = merge(MergeOptions(base=str(base), loras=[str(tmp_path / f"{name}.safetensors")],
                                    save_folder=str(tmp_path / f"m-{name}"), precision="fp32"))
        assert not report.loras[0].unmatched
        outs[name] = predict(pipeline("sd3", tmp_path / f"m-{name}").transformer, "sd3",
                             TrainConfig())
    torch.testing.assert_close(outs["kohya"], outs["mine"], atol=1e-5, rtol=1e-5)
