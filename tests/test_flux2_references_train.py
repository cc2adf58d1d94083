"""FLUX.2 trains in the one loop on edit pairs with reference images (two targets, one with two
references, built here): the LoRA file loads in diffusers' ``Flux2KleinPipeline`` (dev:
``Flux2Pipeline``) ``load_lora_weights`` and gives the trained output on fixed references
(1e-5); its names are FLUX.2's ComfyUI form (``lora_unet_`` + a BFL weight path, every one of
which ComfyUI maps: tests/test_flux2_lora.py's ``bfl_weights``). The tiny edit preset trains on
the sample dataset's controls, and a sample prompt's ``--ci`` references reach the pipeline; a
text-first run from ComfyUI's split files caches the references with the targets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from control_helpers import noise, pairs, watch_edit_run
from diffusers import Flux2KleinPipeline, Flux2Pipeline
from safetensors import safe_open
from safetensors.torch import load_file
from test_flux2_lora import bfl_weights
from test_flux2_split_files import section, split  # noqa: F401 - fixture
from train_helpers import small_config

from trainer.events import ListSink, Log
from trainer.families import family
from trainer.models.loader import resolve_model_path
from trainer.models.text_conditioning import TextConditioning
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
TWINS = {"klein": "embedded:tiny-flux2", "dev": "embedded:tiny-flux2-dev"}
PIPELINES = {"klein": Flux2KleinPipeline, "dev": Flux2Pipeline}
FLUX2 = type(family("flux2"))


def edit_config(tmp_path, twin: str, model: Optional[dict] = None, **sections):
    """Targets a (64 x 64, two references: its inverse and an 80 x 64 picture) and b
    (64 x 80, one reference), at their own sizes; ``model``: another model section."""
    train = pairs(tmp_path / "data", names=("a", "b"), sizes=((64, 64), (64, 80)))
    noise(train / "control" / "a_1.png", (80, 64), seed=9)
    dataset = {"control_dir": "control", "bucket_reso_steps": 16}
    return small_config(tmp_path, train,
                        model=model or {"pretrained_model_name_or_path": TWINS[twin]},
                        dataset=dataset, **sections)


def fixed_inputs(transformer):
    """A noisy target, its sigma, text and two references of other sizes than the target's."""
    gen = torch.Generator().manual_seed(7)
    channels = transformer.config.in_channels // 4
    text = TextConditioning(torch.randn(1, 12, transformer.config.joint_attention_dim,
                                        generator=gen))
    return (torch.randn(1, channels, 8, 8, generator=gen), torch.tensor([0.6]), text,
            [torch.randn(1, channels, 6, 4, generator=gen),
             torch.randn(1, channels, 4, 10, generator=gen)])


def predict(transformer, cfg) -> torch.Tensor:
    noisy, sigma, text, references = fixed_inputs(transformer)
    with torch.no_grad():
        return family("flux2", guidance=cfg.flow.guidance_scale).predict(
            SimpleNamespace(denoiser=transformer), noisy, sigma, text, None, cfg,
            controls=references)


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_a_lora_trains_on_references_and_diffusers_reproduces_it(tmp_path, monkeypatch, twin):
    cfg = edit_config(tmp_path, twin, network={"network_alpha": 2.0, "network_dim": 4},
                      optimizer={"learning_rate": 1e-2}, training={"max_train_steps": 4})
    trained, steps = watch_edit_run(monkeypatch, FLUX2, lambda model: predict(model.unet, cfg))
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    # every step read its references, each at its own size (/ 8), in their files' order
    assert len(steps) == 4
    assert set(steps) == {((1, 8, 8, 8), (1, 8, 8, 10)), ((1, 8, 10, 8),)}
    pipe = PIPELINES[twin].from_pretrained(resolve_model_path(TWINS[twin]),
                                           local_files_only=True)
    before = predict(pipe.transformer, cfg)
    names = {"lora_unet_" + k[:-len(".weight")].replace(".", "_"): shape
             for k, shape in bfl_weights(SimpleNamespace(denoiser=pipe.transformer)).items()
             if k.endswith(".weight")}
    pipe.load_lora_weights(result.output_path)
    after = predict(pipe.transformer, cfg)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, trained["out"], atol=1e-5, rtol=1e-5)
    tensors = load_file(result.output_path)
    modules = {k.split(".")[0] for k in tensors}
    assert modules - names.keys() == set()  # ComfyUI: no "lora key not loaded"
    for name in modules:
        up, down = tensors[f"{name}.lora_up.weight"], tensors[f"{name}.lora_down.weight"]
        assert (up.shape[0], down.shape[1]) == names[name], name
    assert "lora_unet_double_blocks_0_img_attn_qkv" in modules
    with safe_open(result.output_path, "pt") as f:
        assert f.metadata()["ss_base_model_version"] == "flux2"


def test_the_tiny_edit_preset_trains_on_the_sample_pairs_and_samples_with_references(
        tmp_path, monkeypatch):
    """presets/lora/tiny-flux2-edit.toml: the embedded sample dataset's controls are found
    (each step reads a reference), and a sample prompt's ``--ci`` references (one, or two)
    reach the pipeline at time positions 10, 20 (the same prompt and seed without them gives
    another image)."""
    from diffusers import Flux2Transformer2DModel
    from PIL import Image

    from trainer.config.files import from_dict, load, to_dict
    from trainer.config.paths import PROJECT_ROOT, data_home
    from trainer.data.sample import SAMPLE_CONTROLS, sample_control_files
    from trainer.events import Sample

    first, second = (data_home() / "embedded" / SAMPLE_CONTROLS / name
                     for name in sorted(sample_control_files())[:2])
    prompt = "a red circle, blue background --d 3 --s 2"
    raw = to_dict(load(PROJECT_ROOT / "presets" / "lora" / "tiny-flux2-edit.toml",
                       [f"saving.output_dir={tmp_path}", "training.log_with=none",
                        "training.max_train_steps=2", "sampling.sample_every_n_steps=2"]))
    raw["sampling"]["sample_prompts"] = [f"{prompt} --ci {first}",
                                         f"{prompt} --ci {first} --ci {second}", prompt]
    steps, sampled = [], []
    real_predict, real_forward = FLUX2.predict, Flux2Transformer2DModel.forward

    def seen(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        if model.denoiser.training:
            steps.append(len(controls or []))
        return real_predict(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    def forward(self, *args, **kwargs):
        if not self.training:  # the samples' pipeline: the time positions of its tokens
            sampled.append(tuple(kwargs["img_ids"][0, :, 0].unique().tolist()))
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(FLUX2, "predict", seen)
    monkeypatch.setattr(Flux2Transformer2DModel, "forward", forward)
    sink = ListSink()
    result = run(from_dict(raw), sink)
    assert result.status == "finished", result.error
    assert steps == [1, 1]
    assert sampled == [(0, 10)] * 2 + [(0, 10, 20)] * 2 + [(0,)] * 2  # 2 steps per sample
    [sample] = sink.of(Sample)
    one, two, without = (Image.open(p).convert("RGB").tobytes() for p in sample.paths)
    assert len({one, two, without}) == 3


def test_a_text_first_run_from_split_files_trains_on_its_references(
        split, tmp_path, monkeypatch):  # noqa: F811
    """ComfyUI's split files train text first: the references' latents are cached with the
    targets' before the VAE's encoder is let go, and every step reads them."""
    _, files, _ = split
    steps, real_predict = [], FLUX2.predict

    def seen(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        steps.append(len(controls or []))
        return real_predict(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    monkeypatch.setattr(FLUX2, "predict", seen)
    cfg = edit_config(tmp_path, "klein", model=section(files).model_dump(exclude_none=True),
                      training={"max_train_steps": 4, "mixed_precision": "no"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert sorted(steps) == [1, 1, 2, 2]
    logs = [e.message for e in sink.of(Log)]
    assert any(m.startswith("Text encoders released") for m in logs)
    assert any(m.startswith("VAE encoder released") for m in logs)
