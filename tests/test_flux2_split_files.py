"""FLUX.2 klein from the split files people download: the diffusion model in BFL's layout (bf16
as ``flux-2-klein-4b.safetensors``; ComfyUI's fp8mixed), the Qwen3 text-encoder file
(``model.text_encoder``, as ``qwen_3_4b.safetensors``) and the VAE file (``model.ae``, as
``flux2-vae.safetensors``). The tiny twin written so loads as the folder's model (to the file's
bf16), with fp8 storage where asked and ComfyUI's scales applied, and trains a LoRA with its
captions encoded before the transformer is built; a missing part names the setting to set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.events import ListSink, Log
from trainer.families import detect_path, family_of
from trainer.families.flux2 import single_file
from trainer.families.flux2.checkpoint import (
    bfl_tensors,
    qwen3_tensors,
    save_checkpoint,
    vae_tensors,
)
from trainer.families.spec import ModelLoadError
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.run import caches, text_first
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
TINY = "embedded:tiny-flux2"
E4M3 = torch.float8_e4m3fn


def bf16(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16).float() for k, v in module.state_dict().items()}


def to_bf16(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}


def fp8mixed(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """ComfyUI's mixed form (``comfy/quant_ops.py``: scale = amax / 448, fp8(W / scale),
    ``<layer>.comfy_quant`` JSON) of every block Linear; (file tensors, the weights it means)."""
    out, means = {}, {}
    for key, w in tensors.items():
        if not (key.endswith(".weight") and w.ndim == 2 and "_blocks." in key):
            out[key] = w.to(torch.bfloat16).contiguous()
            continue
        layer = key[:-len(".weight")]
        scale = w.abs().amax().float() / torch.finfo(E4M3).max
        q = (w.float() / scale).to(E4M3)
        out.update({key: q, f"{layer}.weight_scale": scale,
                    f"{layer}.comfy_quant": torch.tensor(list(json.dumps(
                        {"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)})
        means[key] = (q.float() * scale).to(torch.bfloat16)
    return out, means


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """(folder model, {part: file}, the fp8mixed file's meant weights)."""
    root = tmp_path_factory.mktemp("flux2_split")
    model = load_base_model(ModelSection(pretrained_model_name_or_path=TINY))
    files = {"dit": root / "flux-2-klein-4b.safetensors",
             "te": root / "qwen_3_4b.safetensors", "vae": root / "flux2-vae.safetensors",
             "mixed": root / "flux-2-klein-4b_fp8mixed.safetensors"}
    save_checkpoint(files["dit"], {"transformer": model.denoiser}, dtype=torch.bfloat16)
    save_file(to_bf16(qwen3_tensors(model.text_encoder)), str(files["te"]))
    save_file(to_bf16(vae_tensors(model.vae)), str(files["vae"]))
    mixed, means = fp8mixed(bfl_tensors(model.denoiser))
    save_file(mixed, str(files["mixed"]))
    return model, files, means


def section(files: dict[str, Path], dit: str = "dit", **more) -> ModelSection:
    folder = str(resolve_model_path(TINY))
    return ModelSection(pretrained_model_name_or_path=str(files[dit]),
                        text_encoder=str(files["te"]), ae=str(files["vae"]),
                        config_dir=folder, tokenizer=folder, **more)


def test_the_split_files_load_as_the_folders_model(split):
    model, files, _ = split
    found = detect_path(files["dit"])
    assert found.family == "flux2" and found.header.parts_inside == {"transformer"}
    loaded = load_base_model(section(files))
    assert loaded.version == "flux2" and loaded.variant == "klein-4b"
    for name in ("denoiser", "text_encoder", "vae"):
        want, got = bf16(getattr(model, name)), getattr(loaded, name).state_dict()
        assert got.keys() == want.keys(), name
        assert all(torch.equal(got[k].float(), want[k]) for k in want), name
    assert loaded.tokenizer("a shape").input_ids == model.tokenizer("a shape").input_ids


def test_fp8_storage_loads_the_transformers_layers_in_fp8(split):
    _, files, _ = split
    loaded = load_base_model(section(files, base_precision="fp8"), dtype=torch.bfloat16)
    dtypes = {p.dtype for n, p in loaded.denoiser.named_parameters() if "ff.linear_in" in n}
    assert dtypes == {E4M3}


def test_comfyuis_fp8mixed_file_reads_as_its_scaled_weights(split):
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers as convert,
    )

    _, files, means = split
    loaded = load_base_model(section(files, "mixed"), dtype=torch.bfloat16)
    want = convert(dict(means))
    got = loaded.denoiser.state_dict()
    assert want and all(torch.equal(got[k], v) for k, v in want.items())


def test_a_missing_part_names_its_setting(split):
    _, files, _ = split
    for setting in ("text_encoder", "ae"):
        bare = section(files).model_copy(update={setting: None})
        with pytest.raises(ModelLoadError, match=f"model.{setting}"):
            load_base_model(bare)


def train_text_first(model_section: ModelSection, tmp_path: Path, monkeypatch):
    """A 2-step LoRA run from split files, watching the transformer's build: (result, log
    messages, whether each text encoder was released when the transformer was built)."""
    seen, real_fill, real_build = {}, caches.fill_text_cache, single_file.build_transformer

    def fill(s, out, **kwargs):
        seen["session"] = s
        real_fill(s, out, **kwargs)

    def build(*args, **kwargs):
        if "session" in seen:
            model = seen["session"].model
            seen["released"] = [text_first.released(enc) for _, enc, _ in
                                family_of(model).text_encoders(model)]
        return real_build(*args, **kwargs)

    monkeypatch.setattr(caches, "fill_text_cache", fill)
    monkeypatch.setattr(single_file, "build_transformer", build)
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, model=model_section.model_dump(exclude_none=True),
                       training={"max_train_steps": 2, "mixed_precision": "no"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert Path(result.output_path).is_file()
    return result, [e.message for e in sink.of(Log)], seen.get("released")


def test_a_lora_trains_from_the_split_files_text_first(split, tmp_path, monkeypatch):
    """The captions are encoded and Qwen3 released before the transformer is built."""
    _, files, _ = split
    _, logs, released = train_text_first(section(files), tmp_path, monkeypatch)
    assert released == [True]
    assert any(m.startswith("Text encoders released") for m in logs)


def test_a_diffusers_layout_transformer_file_loads_too(split, tmp_path):
    model, files, _ = split
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_file(to_bf16(model.denoiser.state_dict()), str(path))
    assert detect_path(path).header.layout == "diffusers"
    loaded = load_base_model(section({**files, "dit": path}))
    want = bf16(model.denoiser)
    assert all(torch.equal(loaded.denoiser.state_dict()[k].float(), v) for k, v in want.items())
