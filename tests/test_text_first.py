"""Text first (trainer/run/text_first.py): a LoRA run on a FLUX.1 / SD 3.5 single file encodes
every caption and lets the frozen text encoders go before the transformer is built, so T5 and
the transformer are never in memory together (issue 29), and trains the same LoRA as before."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_flow_train import flow_config, single_file_model

from trainer.config.files import from_dict
from trainer.events import ListSink, Log
from trainer.families import family_of
from trainer.methods import get_method
from trainer.run import caches, text_first
from trainer.run.loop import run


def lora_run(tmp_path, family: str, **model):
    cfg = flow_config(tmp_path, family,
                      model={**single_file_model(tmp_path, family), **model},
                      training={"max_train_steps": 2, "mixed_precision": "no"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return load_file(result.output_path), [e.message for e in sink.of(Log)]


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_the_transformer_is_built_after_the_text_encoders_are_released(tmp_path, monkeypatch,
                                                                        family):
    """At the moment the transformer is built, every caption's outputs are cached and each
    text encoder holds no memory (its tensors on the meta device); the LoRA is the one the run
    trains with the transformer loaded first, bit for bit."""
    from trainer.families.common import mmdit_single_file as flow_single_file

    seen, real_fill, real_build = {}, caches.fill_text_cache, flow_single_file.build_transformer

    def fill(s, out, **kwargs):
        seen["session"] = s
        real_fill(s, out, **kwargs)

    def build(*args, **kwargs):
        if "session" in seen:  # the captions were encoded before the transformer was built
            model = seen["session"].model
            seen["encoders at build"] = [text_first.released(enc) for _, enc, _ in
                                         family_of(model).text_encoders(model)]
        return real_build(*args, **kwargs)

    monkeypatch.setattr(caches, "fill_text_cache", fill)
    monkeypatch.setattr(flow_single_file, "build_transformer", build)
    first, logs = lora_run(tmp_path / "first", family, base_precision="fp8",
                           fp8_text_encoders=True)
    assert seen["encoders at build"] == [True] * (2 if family == "flux1" else 3)
    assert any(m.startswith("Text encoders released once every caption was encoded")
               for m in logs)
    assert any(m.startswith("Text-encoder cache ready: 1 caption(s) encoded") for m in logs)

    monkeypatch.setattr(text_first, "applies", lambda *a: False)
    seen.clear()
    before, logs = lora_run(tmp_path / "before", family, base_precision="fp8",
                            fp8_text_encoders=True)
    assert "encoders at build" not in seen  # built at the load, before any caption
    assert not any(m.startswith("Text encoders released") for m in logs)
    assert first.keys() == before.keys()
    for key, tensor in first.items():
        assert torch.equal(tensor, before[key]), key


def test_text_first_applies_only_where_nothing_later_needs_a_text_encoder(tmp_path):
    base = {"model": {"pretrained_model_name_or_path": "x.safetensors"},
            "training": {"mixed_precision": "no"}}
    data = type("Data", (), {"text_cache_blocker": None})()

    def applies(backend="cpu", **changes):
        sections = {k: {**base.get(k, {}), **changes.get(k, {})} for k in {*base, *changes}
                    if k != "mode"}
        cfg = from_dict({"mode": changes.get("mode", "lora"), **sections})
        return text_first.applies(cfg, get_method(cfg), data, backend)

    assert applies()
    assert applies("cuda", training={"mixed_precision": "auto"})
    assert not applies(training={"mixed_precision": "auto"})  # the CPU probes the denoiser
    assert not applies(sampling={"sample_prompts": ["a cat"]})
    assert not applies(dataset={"cache_text_encoder_outputs": False})
    assert not applies(dataset={"validation_split": 0.2})
    assert not applies(network={"train_text_encoder": True})
    assert not applies(mode="dreambooth")  # saves the text encoders with the model
    data.text_cache_blocker = "random caption dropout"
    assert not applies()
