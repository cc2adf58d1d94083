"""Text first from a Z-Image diffusers folder (trainer/run/text_first.py): a LoRA run whose
captions are all cached encodes them, lets Qwen3 go and only then reads the folder's
transformer, so the two are never in memory together (the folder's load role takes
``defer_denoiser``); the LoRA is the one the run trains with everything loaded at once."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log
from trainer.families import family_of
from trainer.families.zimage import load as zimage_load
from trainer.run import caches, text_first
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")


def lora_run(tmp_path, images: int = 1, steps: int = 2):
    """A fp32 LoRA run on the tiny Z-Image over ``images`` copies of the one-image dataset's
    circle (each its own caption): (its file, its log lines)."""
    data = tmp_path / "data"
    one_image_dataset(data)
    folder = next(data.iterdir())
    for name in ("b", "c", "d", "e")[:images - 1]:
        (folder / f"{name}.png").write_bytes((folder / "circle.png").read_bytes())
        (folder / f"{name}.txt").write_text(f"a {name} circle")
    cfg = small_config(tmp_path, data, model={"pretrained_model_name_or_path":
                                              "embedded:tiny-zimage"},
                       training={"max_train_steps": steps, "mixed_precision": "no"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return load_file(result.output_path), [e.message for e in sink.of(Log)]


def test_a_zimage_folder_reads_its_transformer_after_qwen3_is_released(tmp_path, monkeypatch):
    seen, real_fill, real_build = {}, caches.fill_text_cache, zimage_load._folder_transformer

    def fill(s, out, **kwargs):
        seen["session"] = s
        real_fill(s, out, **kwargs)

    def build(*args, **kwargs):
        model = seen["session"].model
        seen["encoders at build"] = [text_first.released(enc) for _, enc, _ in
                                     family_of(model).text_encoders(model)]
        return real_build(*args, **kwargs)

    monkeypatch.setattr(caches, "fill_text_cache", fill)
    monkeypatch.setattr(zimage_load, "_folder_transformer", build)
    first, logs = lora_run(tmp_path / "first")
    assert seen["encoders at build"] == [True]
    assert any(m.startswith("Text encoders released once every caption was encoded")
               for m in logs)

    monkeypatch.setattr(text_first, "applies", lambda *a: False)
    seen.clear()
    before, logs = lora_run(tmp_path / "before")
    assert "encoders at build" not in seen  # the transformer came with the pipeline
    assert not any(m.startswith("Text encoders released") for m in logs)
    assert first.keys() == before.keys()
    for key, tensor in first.items():
        assert torch.equal(tensor, before[key]), key


def test_a_zimage_folder_s_bf16_text_encoder_runs_in_the_run_s_dtype(tmp_path):
    """transformers 5 reads Qwen3 in the dtype it is stored in (bf16 in the released folders);
    an fp32 run encodes in fp32, as diffusers' example does (a bf16 matmul on a CPU without
    bf16 units is several times slower), and a bf16 run keeps it in bf16."""
    from transformers import Qwen3Model

    from trainer.config.sections.model import ModelSection
    from trainer.families.zimage.tiny import save_tiny_zimage
    from trainer.models.loader import load_base_model

    folder = save_tiny_zimage(tmp_path / "zimage")
    encoder = Qwen3Model.from_pretrained(folder / "text_encoder")
    encoder.to(torch.bfloat16).save_pretrained(folder / "text_encoder")
    section = ModelSection(pretrained_model_name_or_path=str(folder))
    assert load_base_model(section).text_encoder.dtype == torch.bfloat16  # as stored
    assert load_base_model(section, torch.float32).text_encoder.dtype == torch.float32
    assert load_base_model(section, torch.bfloat16).text_encoder.dtype == torch.bfloat16


def test_a_text_first_cpu_run_encodes_every_image_before_the_transformer(tmp_path, monkeypatch):
    """On the CPU the latent cache fills as the first epoch goes, except in a text-first run:
    there every image is encoded before the transformer is built (the encode never shares the
    memory with it, and no step of the first epoch carries an encode), and the VAE's encoder is
    let go; the LoRA is the one the lazily cached run trains."""
    from trainer.run.unused import Released

    seen, real_build, real_encode = {}, zimage_load._folder_transformer, caches.encode_images
    real_fill, encoded = caches.fill_text_cache, []

    def encode(vae, px, *family):
        encoded.append(px.shape[0])
        return real_encode(vae, px, *family)

    def build(*args, **kwargs):
        seen["encoded at build"] = sum(encoded)
        seen["encoder at build"] = seen["session"].model.vae.encoder
        return real_build(*args, **kwargs)

    def fill(s, out, **kwargs):
        seen["session"] = s
        real_fill(s, out, **kwargs)

    def train(root):
        return lora_run(root, images=3, steps=1)

    monkeypatch.setattr(caches, "encode_images", encode)
    monkeypatch.setattr(caches, "fill_text_cache", fill)
    monkeypatch.setattr(zimage_load, "_folder_transformer", build)
    first, logs = train(tmp_path / "first")
    assert isinstance(seen["encoder at build"], Released)
    with pytest.raises(RuntimeError, match="encoder was released: every image was encoded"):
        seen["encoder at build"](torch.zeros(1))
    assert seen["encoded at build"] == 3  # all three, for a run of one step
    assert any(m.startswith("Latent cache ready: 3 image(s)") for m in logs)
    assert any(m.startswith("VAE encoder released") for m in logs)

    monkeypatch.setattr(text_first, "applies", lambda *a: False)
    encoded.clear()
    seen.clear()
    lazy_lora, logs = train(tmp_path / "lazy")
    assert sum(encoded) == 1  # one step: the one image it trains on, when it reaches it
    assert not any(m.startswith("VAE encoder released") for m in logs)
    assert first.keys() == lazy_lora.keys()
    for key, tensor in first.items():
        torch.testing.assert_close(tensor, lazy_lora[key], rtol=0, atol=1e-6)
