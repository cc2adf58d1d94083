"""The VAE's decoder is let go where nothing in the run decodes (trainer/run/unused.py): a LoRA
run with no sample prompts trains the same LoRA without it; a run that samples keeps it."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log
from trainer.run import caches, unused
from trainer.run.loop import run


def _run(tmp_path, monkeypatch, **sections):
    seen = {}
    real = caches.fill_latent_cache

    def fill(s, out):
        seen["vae"] = s.model.vae
        real(s, out)

    monkeypatch.setattr(caches, "fill_latent_cache", fill)
    monkeypatch.setattr("trainer.run.session.fill_latent_cache", fill)
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    cfg = small_config(tmp_path, data, training={"max_train_steps": 2, "log_with": "none"},
                       **sections)
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return seen["vae"], result, [e.message for e in sink.of(Log)]


def test_a_lora_run_that_samples_nothing_trains_the_same_without_the_decoder(tmp_path,
                                                                              monkeypatch):
    vae, result, logs = _run(tmp_path / "released", monkeypatch)
    assert isinstance(vae.decoder, unused.Released)
    assert sum(p.numel() for p in vae.decoder.parameters()) == 0
    assert any(m.startswith("VAE decoder released") for m in logs)
    with pytest.raises(RuntimeError, match="released"):
        vae.decode(vae.encode(__import__("torch").zeros(1, 3, 64, 64)).latent_dist.mode())

    monkeypatch.setattr(unused, "decoder_unused", lambda cfg: False)
    kept, again, _ = _run(tmp_path / "kept", monkeypatch)
    assert not isinstance(kept.decoder, unused.Released)
    first, second = load_file(result.output_path), load_file(again.output_path)
    assert first.keys() == second.keys()
    assert all((first[k] == second[k]).all() for k in first)


def test_a_run_that_samples_keeps_the_decoder(tmp_path, monkeypatch):
    vae, result, logs = _run(tmp_path, monkeypatch, sampling={
        "sample_prompts": ["a red circle"], "sample_steps": 2, "sample_every_n_steps": 2})
    assert not isinstance(vae.decoder, unused.Released)
    assert not any(m.startswith("VAE decoder released") for m in logs)
    assert list((tmp_path / "out" / "sample").glob("*.png"))
