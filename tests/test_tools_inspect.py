"""Inspecting LoRA, LyCORIS and embedding files: a LoRA trained here, files with the keys and
metadata sd-scripts and LyCORIS write (built in the tests with SD 1.5 / 2.x / SDXL widths), and
textual-inversion embeddings. Norms are checked against the update computed from the tensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tools_helpers import lora_pair, sd_scripts_metadata
from train_helpers import one_image_dataset, small_config

from trainer.tools.common import ToolError
from trainer.tools.inspect import format_inspect, inspect
from trainer.tools.options import InspectOptions


def run_inspect(path, **kw):
    return inspect(InspectOptions(path=str(path), **kw))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    from trainer.run.loop import run

    root = tmp_path_factory.mktemp("trained")
    cfg = small_config(root, one_image_dataset(root / "data"),
                       network={"conv_dim": 2, "conv_alpha": 1.0, "train_text_encoder": True})
    result = run(cfg)
    assert result.status == "finished", result.error
    return result.output_path


def test_a_trained_lora(trained):
    from safetensors import safe_open

    report = run_inspect(trained)
    with safe_open(trained, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    names = {k.split(".")[0] for k in tensors}
    assert report.parts() == {"unet": sum(n.startswith("lora_unet_") for n in names),
                              "te": sum(n.startswith("lora_te_") for n in names)}
    assert report.family == "sd1" and report.family_reason == "from the metadata"
    assert report.network_type == "LoRA with 3x3 convolutions (LoCon)"
    for m in report.modules:
        up = tensors[f"{m.name}.lora_up.weight"].double().flatten(1)
        down = tensors[f"{m.name}.lora_down.weight"].double().flatten(1)
        alpha = float(tensors[f"{m.name}.alpha"])
        assert m.rank == down.shape[0] and m.alpha == alpha
        assert m.norm == pytest.approx(float((up @ down).norm()) * alpha / down.shape[0],
                                       rel=1e-4)
    ranks = {(m.conv or m.name.endswith("conv_shortcut"), m.rank) for m in report.modules}
    assert ranks == {(False, 8), (True, 2)}  # the 1x1 conv_shortcut takes conv_dim too
    facts = dict(report.facts)
    assert facts["Training steps"] == "3 of 3" and facts["Training images"] == "1"
    assert facts["Network"] == 'networks.lora dim 8 alpha 8.0 {"conv_dim": "2", "conv_alpha": "1"}'
    assert report.tags == [("a red circle", 1)]
    text = format_inspect(report)
    assert "- Rank: 8 (min 2, max 8); alpha: 8 (min 1, max 8)" in text
    assert "- Conv rank: 2; alpha: 1" in text
    assert "#### Largest updates" in text


def sd15_file(tmp_path, meta):
    tensors = lora_pair("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k",
                        320, 768, 16, 8.0, 1)
    tensors.update(lora_pair("lora_unet_down_blocks_0_attentions_0_proj_in", 320, 320, 16, 8.0,
                             2, kernel=(1, 1)))
    tensors.update(lora_pair("lora_te_text_model_encoder_layers_0_self_attn_q_proj", 768, 768,
                             16, 8.0, 3))
    path = tmp_path / "sd15.safetensors"
    save_file(tensors, str(path), metadata=meta)
    return path


def test_an_sd_scripts_file_in_readable_form(tmp_path):
    report = run_inspect(sd15_file(tmp_path, sd_scripts_metadata()), top_tags=2)
    facts = dict(report.facts)
    assert facts["Training steps"] == "200 of 200" and facts["Epochs"] == "10 of 10"
    assert facts["Base model"] == "v1-5-pruned-emaonly.safetensors"
    assert facts["Base model hash"] == ("cc6cb2710341 (ss_new_sd_model_hash), 81761151 "
                                        "(ss_sd_model_hash)")
    assert facts["Datasets"] == "10_sks dog (4 images x 10 repeats)"
    assert facts["Duration"] == "10.0 min" and facts["Optimizer"].endswith("AdamW8bit")
    assert "Comment" not in facts  # sd-scripts writes "None" for unset values
    assert report.tags == [("sks dog", 4), ("grass", 3)]
    assert report.parts() == {"unet": 2, "te": 1}
    assert {(m.rank, m.alpha) for m in report.modules} == {(16, 8.0)}


@pytest.mark.parametrize("module, width, family", [
    ("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k", 768, "sd1"),
    ("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k", 1024, "sd2"),
    ("lora_te_text_model_encoder_layers_0_self_attn_q_proj", 1024, "sd2"),
    ("lora_unet_input_blocks_4_1_transformer_blocks_0_attn2_to_k", 2048, "sdxl"),
    ("lora_te2_text_model_encoder_layers_0_self_attn_q_proj", 1280, "sdxl"),
])
def test_family_from_the_tensors_without_metadata(tmp_path, module, width, family):
    path = tmp_path / "bare.safetensors"
    save_file(lora_pair(module, 64, width, 4, 4.0, 0), str(path))
    report = run_inspect(path)
    assert report.family == family and report.family_reason.startswith("from the tensors")
    assert report.facts == [] and report.tags == []


def test_lycoris_loha_and_lokr(tmp_path):
    gen = torch.Generator().manual_seed(0)
    t = {n: torch.randn(*s, generator=gen) for n, s in {
        "hada_w1_a": (64, 4), "hada_w1_b": (4, 32), "hada_w2_a": (64, 4), "hada_w2_b": (4, 32)
    }.items()}
    k = {"lokr_w1": torch.randn(4, 4, generator=gen), "lokr_w2_a": torch.randn(16, 2,
                                                                               generator=gen),
         "lokr_w2_b": torch.randn(2, 8, generator=gen)}
    loha, lokr = "lora_unet_mid_block_attentions_0_proj_out", "lora_te_text_model_encoder_" \
        "layers_0_mlp_fc1"
    tensors = {f"{loha}.{n}": v for n, v in t.items()} | {f"{lokr}.{n}": v for n, v in k.items()}
    tensors |= {f"{loha}.alpha": torch.tensor(2.0), f"{lokr}.alpha": torch.tensor(1.0)}
    path = tmp_path / "lyco.safetensors"
    args = json.dumps({"algo": "loha", "conv_dim": "4"})
    save_file(tensors, str(path), metadata={"ss_network_module": "lycoris.kohya",
                                            "ss_network_args": args})
    report = run_inspect(path)
    assert report.network_type == "LyCORIS (loha): LoHa + LoKr"
    mods = {m.name: m for m in report.modules}
    want = (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"]) * 2.0 / 4
    assert mods[loha].kind == "loha" and mods[loha].rank == 4
    assert mods[loha].norm == pytest.approx(float(want.norm()), rel=1e-5)
    want = torch.kron(k["lokr_w1"], k["lokr_w2_a"] @ k["lokr_w2_b"]) * 1.0 / 2
    assert mods[lokr].kind == "lokr" and mods[lokr].rank == 2
    assert mods[lokr].norm == pytest.approx(float(want.norm()), rel=1e-5)


def test_embeddings(tmp_path):
    sd1, sdxl = tmp_path / "ti.safetensors", tmp_path / "ti-xl.safetensors"
    save_file({"emb_params": torch.zeros(2, 768)}, str(sd1),
              metadata={"ti_token_string": "<cat>", "ss_steps": "100"})
    save_file({"clip_l": torch.zeros(1, 768), "clip_g": torch.zeros(1, 1280)}, str(sdxl))
    report = run_inspect(sd1)
    assert report.network_type == "textual-inversion embedding, 2 vectors"
    assert report.family == "sd1" and report.embedding == {"emb_params": (2, 768)}
    assert dict(report.facts)["Trigger"] == "<cat>"
    assert "- emb_params: 2 vectors of width 768" in format_inspect(report)
    assert run_inspect(sdxl).family == "sdxl"


def test_diffusers_peft_keys_read_under_kohya_names(tmp_path):
    path = tmp_path / "peft.safetensors"
    save_file({"unet.mid_block.attentions.0.proj_out.lora_A.weight": torch.ones(2, 8),
               "unet.mid_block.attentions.0.proj_out.lora_B.weight": torch.ones(8, 2),
               "text_encoder.text_model.encoder.layers.0.mlp.fc1.lora_A.weight": torch.ones(2, 8),
               "text_encoder.text_model.encoder.layers.0.mlp.fc1.lora_B.weight": torch.ones(8, 2)},
              str(path))
    mods = {m.name: m for m in run_inspect(path).modules}
    assert set(mods) == {"lora_unet_mid_block_attentions_0_proj_out",
                         "lora_te_text_model_encoder_layers_0_mlp_fc1"}
    assert mods["lora_unet_mid_block_attentions_0_proj_out"].norm == pytest.approx(16.0)


def test_files_that_are_not_loras(tmp_path):
    other = tmp_path / "other.safetensors"
    save_file({"model.diffusion_model.out.2.weight": torch.zeros(2)}, str(other))
    with pytest.raises(ToolError, match="no LoRA"):
        run_inspect(other)
    pickle = tmp_path / "old.ckpt"
    pickle.write_bytes(b"not read")
    with pytest.raises(ToolError, match="only .safetensors"):
        run_inspect(pickle)
    with pytest.raises(ToolError, match="no such file"):
        run_inspect(tmp_path / "missing.safetensors")
