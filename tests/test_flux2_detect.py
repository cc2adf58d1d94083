"""FLUX.2 told from a safetensors header alone: BFL's layout, bare or under ComfyUI's prefix,
the variant by the shapes of musubi-tuner's table (klein 4B 3072 wide, 9B 4096, dev 6144 with
a guidance embedder), klein-base by its name or the pipeline's ``is_distilled``; a FLUX.1
header is not FLUX.2's (both have ``double_blocks.0.img_attn.qkv``); the doctor names the part
files a transformer-only file needs, and the advisor says why it has no estimate."""

from __future__ import annotations

import pytest

from trainer.families import detect_path
from trainer.families.flux2.detect import header_info

# (hidden, double blocks, single blocks, text width, guidance embedder) of each release
RELEASES = {"klein-4b": (3072, 5, 20, 7680, False), "klein-9b": (4096, 8, 24, 12288, False),
            "dev": (6144, 8, 48, 15360, True)}


def bfl_header(hidden: int, double: int, single: int, text: int, guidance: bool,
               prefix: str = "") -> dict:
    """The keys and shapes of BFL's FLUX.2 transformer (diffusers' converter's names)."""
    t = {"img_in.weight": [hidden, 128], "txt_in.weight": [hidden, text],
         "double_stream_modulation_img.lin.weight": [6 * hidden, hidden],
         "single_stream_modulation.lin.weight": [3 * hidden, hidden],
         "time_in.in_layer.weight": [hidden, 256]}
    if guidance:
        t["guidance_in.in_layer.weight"] = [hidden, 256]
    for n in range(double):
        t[f"double_blocks.{n}.img_attn.qkv.weight"] = [3 * hidden, hidden]
        t[f"double_blocks.{n}.img_attn.norm.query_norm.scale"] = [128]
        t[f"double_blocks.{n}.img_mlp.0.weight"] = [6 * hidden, hidden]
    for n in range(single):
        t[f"single_blocks.{n}.linear1.weight"] = [9 * hidden, hidden]
    return {prefix + k: {"dtype": "BF16", "shape": v, "data_offsets": [0, 0]}
            for k, v in t.items()}


def write(path, header: dict) -> None:
    """A safetensors file of zeros with this header's keys and shapes."""
    import torch
    from safetensors.torch import save_file

    save_file({k: torch.zeros(v["shape"], dtype=torch.bfloat16) for k, v in header.items()},
              str(path))


SMALL = (256, 2, 2, 96, False)  # klein's form at a tiny width (read as klein 4B)


@pytest.mark.parametrize("variant", list(RELEASES))
def test_the_variant_is_read_from_the_shapes(variant):
    info = header_info(bfl_header(*RELEASES[variant]))
    assert info.variant == variant and info.layout == "bfl" and info.prefix == ""
    hidden, double, single, text, guidance = RELEASES[variant]
    assert info.config == {"in_channels": 128, "joint_attention_dim": text,
                           "attention_head_dim": 128, "num_attention_heads": hidden // 128,
                           "num_layers": double, "num_single_layers": single,
                           "mlp_ratio": 3.0, "guidance_embeds": guidance}


def test_comfyuis_prefix_and_all_in_one_parts():
    header = bfl_header(*RELEASES["klein-4b"], prefix="model.diffusion_model.")
    header["vae.decoder.conv_in.weight"] = {"dtype": "BF16", "shape": [512, 32, 3, 3]}
    header["text_encoders.qwen3_4b.transformer.model.layers.0.self_attn.q_norm.weight"] = {
        "dtype": "BF16", "shape": [128]}
    info = header_info(header)
    assert info.prefix == "model.diffusion_model." and info.parts_inside == {
        "transformer", "vae", "qwen3"}


def test_a_flux2_file_is_flux2s_and_a_flux1_file_stays_flux1s(tmp_path):
    path = tmp_path / "flux-2-klein-4b.safetensors"
    write(path, bfl_header(*SMALL))
    found = detect_path(path)
    assert found.family == "flux2" and "FLUX.2 [klein] 4B" in found.description
    # FLUX.1's BFL keys (per-block modulation, no shared one) are not FLUX.2's
    flux1 = {"double_blocks.0.img_attn.qkv.weight": [9, 3],
             "double_blocks.0.img_mod.lin.weight": [18, 3], "img_in.weight": [3, 64],
             "txt_in.weight": [3, 4], "single_blocks.0.linear1.weight": [21, 3]}
    assert header_info({k: {"shape": v, "dtype": "F32"} for k, v in flux1.items()}) is None


def test_the_doctor_names_the_part_files_a_transformer_file_needs(tmp_path):
    from trainer.tools.model_report import model_lines

    path = tmp_path / "flux-2-klein-4b.safetensors"
    write(path, bfl_header(*SMALL))
    text = "\n".join(model_lines(str(path)))
    assert "FLUX.2 [klein] 4B" in text and "holds: transformer" in text
    assert "set model.ae to flux2-vae.safetensors" in text
    assert "set model.text_encoder to qwen_3_4b.safetensors" in text


def test_klein_base_is_told_by_the_name_or_the_pipelines_is_distilled(tmp_path):
    from pathlib import Path

    from trainer.families.flux2.detect import base_from_name, with_base
    from trainer.families.flux2.load import folder_variant

    info = header_info(bfl_header(*RELEASES["klein-9b"]))
    assert with_base(info.variant, base_from_name(Path("flux-2-klein-base-9b.safetensors"))) \
        == "klein-base-9b"
    assert with_base(info.variant, base_from_name(Path("flux-2-klein-9b.safetensors"))) \
        == "klein-9b"
    config = info.config
    assert folder_variant(Path("FLUX.2-klein-4B"), {"is_distilled": False}, config) \
        == "klein-base-9b"
    assert folder_variant(Path("FLUX.2-klein-4B"), {"is_distilled": True}, config) == "klein-9b"
