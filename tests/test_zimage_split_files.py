"""Z-Image from the split files ComfyUI users download: the diffusion model in the native layout
(bf16, as ``z_image_turbo_bf16.safetensors``), the Qwen3 text-encoder file (``model.
text_encoder``, as ``qwen_3_4b.safetensors``) and the VAE file (``model.ae``, as
``ae.safetensors``). The tiny twin written so loads as the folder's model (to the file's bf16),
with fp8 storage where asked, and trains; a missing part names the setting to set."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.events import ListSink
from trainer.families import detect_path
from trainer.families.common.mmdit_checkpoint import vae_tensors
from trainer.families.spec import ModelLoadError
from trainer.families.zimage.checkpoint import qwen3_tensors, save_checkpoint
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
TINY = "embedded:tiny-zimage"


def bf16(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16).float() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """(folder model, {part: file}) of the tiny twin's split files."""
    root = tmp_path_factory.mktemp("zimage_split")
    model = load_base_model(ModelSection(pretrained_model_name_or_path=TINY))
    files = {"dit": root / "z_image_turbo_bf16.safetensors",
             "te": root / "qwen_3_4b.safetensors", "vae": root / "ae.safetensors"}
    save_checkpoint(files["dit"], {"transformer": model.denoiser}, dtype=torch.bfloat16)
    save_file({k: v.to(torch.bfloat16).contiguous()
               for k, v in qwen3_tensors(model.text_encoder).items()}, str(files["te"]))
    save_file({k: v.to(torch.bfloat16).contiguous()
               for k, v in vae_tensors(model.vae).items()}, str(files["vae"]))
    return model, files


def section(files: dict[str, Path], **more) -> ModelSection:
    folder = str(resolve_model_path(TINY))
    return ModelSection(pretrained_model_name_or_path=str(files["dit"]),
                        text_encoder=str(files["te"]), ae=str(files["vae"]),
                        config_dir=folder, tokenizer=folder, **more)


def test_the_split_files_load_as_the_folders_model(split):
    model, files = split
    found = detect_path(files["dit"])
    assert found.family == "zimage" and "Z-Image Turbo" in found.description
    loaded = load_base_model(section(files))
    assert loaded.version == "zimage" and loaded.variant == "turbo"
    for name in ("denoiser", "text_encoder", "vae"):
        want, got = bf16(getattr(model, name)), getattr(loaded, name).state_dict()
        assert got.keys() == want.keys(), name
        assert all(torch.equal(got[k].float(), want[k]) for k in want), name
    assert loaded.tokenizer("a shape").input_ids == model.tokenizer("a shape").input_ids


def test_fp8_storage_loads_the_transformers_layers_in_fp8(split):
    _, files = split
    loaded = load_base_model(section(files, base_precision="fp8"), dtype=torch.bfloat16)
    dtypes = {p.dtype for n, p in loaded.denoiser.named_parameters() if "layers.0.feed" in n}
    assert dtypes == {torch.float8_e4m3fn}


def test_a_missing_text_encoder_names_its_setting(split):
    _, files = split
    bare = section(files).model_copy(update={"text_encoder": None})
    with pytest.raises(ModelLoadError, match="model.text_encoder"):
        load_base_model(bare)


def test_a_lora_trains_from_the_split_files(split, tmp_path):
    _, files = split
    data = one_image_dataset(tmp_path / "data")
    model = section(files).model_dump(exclude_none=True)
    cfg = small_config(tmp_path, data, model=model, training={"max_train_steps": 2})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert Path(result.output_path).is_file()


def test_doctor_names_the_part_files_a_transformer_file_needs(split):
    from trainer.tools.model_report import model_lines

    _, files = split
    text = "\n".join(model_lines(str(files["dit"])))
    assert "Z-Image Turbo" in text and "holds: transformer" in text
    assert "set model.ae to ae.safetensors" in text
    assert "set model.text_encoder to qwen_3_4b.safetensors" in text


def test_the_advisor_reads_the_transformer_config_of_a_split_file(split):
    from trainer.advisor.flow_advice import flow_transformer_config

    model, files = split
    config = flow_transformer_config(section(files))
    assert config["_class_name"] == "ZImageTransformer2DModel"
    for key, value in model.denoiser.config.items():
        if not key.startswith("_"):
            assert config[key] == (list(value) if isinstance(value, tuple) else value), key


def test_comfyuis_scaled_fp8_transformer_loads_dequantized(split, tmp_path):
    """ComfyUI's legacy "scaled fp8" form (``scaled_fp8`` marker, fp8 weights with their
    ``scale_weight``): each weight loads as ``fp8 * scale`` (ComfyUI's ``convert_weight``)."""
    from trainer.families.zimage.checkpoint import native_tensors

    model, files = split
    tensors, expected = {}, {}
    for key, value in native_tensors(model.denoiser).items():
        if key.startswith("layers.") and key.endswith(".weight") and value.dim() == 2:
            scale = value.abs().max().float() / 448.0
            stored = (value.float() / scale).to(torch.float8_e4m3fn)
            tensors[key] = stored
            tensors[key[: -len("weight")] + "scale_weight"] = scale.reshape(())
            expected[key] = stored.float() * scale
        else:
            tensors[key] = value.contiguous()
    tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    path = tmp_path / "z_image_turbo_fp8_scaled.safetensors"
    save_file(tensors, str(path))
    loaded = load_base_model(section(dict(files, dit=path))).denoiser.state_dict()
    dim = model.denoiser.config.dim
    for key, want in expected.items():
        if key.endswith(".attention.qkv.weight"):
            block = key[: -len("qkv.weight")]
            got = torch.cat([loaded[f"{block}to_{p}.weight"] for p in "qkv"])
            assert got.shape == (3 * dim, dim)
        else:
            got = loaded[key.replace(".attention.out.", ".attention.to_out.0.")]
        assert torch.equal(got, want), key


def test_the_advisor_counts_the_part_files_the_settings_name(split):
    from trainer.advisor.host_memory import model_parts

    model, files = split
    parts = model_parts(section(files), "zimage")
    assert parts["qwen3"].params == sum(p.numel() for p in model.text_encoder.parameters())
    assert parts["vae"].params == sum(p.numel() for p in model.vae.parameters())


def test_a_missing_tokenizer_says_how_to_fetch_it(split, monkeypatch, tmp_path):
    _, files = split
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    bare = section(files).model_copy(update={"tokenizer": None})
    with pytest.raises(ModelLoadError, match="hf download Tongyi-MAI/Z-Image-Turbo"):
        load_base_model(bare)
