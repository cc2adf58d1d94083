"""FLUX.1 and SD 3.5 train in the one loop: LoRA on the tiny models, files that diffusers loads to
the trained output, samples and validation through the family, the family's rules at run time."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusion3Pipeline
from flow_helpers import scale_diffusers_flux_split
from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log, Sample, Validation
from trainer.families import family_of
from trainer.methods.lora import LoraMethod
from trainer.models.loader import resolve_model_path
from trainer.models.text_conditioning import TextConditioning
from trainer.run.loop import run

MODELS = {"flux1": "embedded:tiny-flux", "sd3": "embedded:tiny-sd3"}
PIPELINES = {"flux1": FluxPipeline, "sd3": StableDiffusion3Pipeline}


def flow_config(tmp_path, family: str, **sections):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    model = {"pretrained_model_name_or_path": MODELS[family], **sections.pop("model", {})}
    return small_config(tmp_path, data, model=model, **sections)


def fixed_inputs(transformer, family: str):
    """Noisy latents, sigmas and text conditioning of the tiny model's shapes, fixed."""
    gen = torch.Generator().manual_seed(7)
    cfg = transformer.config
    joint = cfg.joint_attention_dim
    pooled = cfg.pooled_projection_dim
    channels = cfg.in_channels // 4 if family == "flux1" else cfg.in_channels
    noisy = torch.randn(2, channels, 8, 8, generator=gen)
    text = TextConditioning(torch.randn(2, 12, joint, generator=gen),
                            torch.randn(2, pooled, generator=gen))
    return noisy, torch.tensor([0.3, 0.8]), text


def predict(transformer, family: str, cfg) -> torch.Tensor:
    noisy, sigmas, text = fixed_inputs(transformer, family)
    model = SimpleNamespace(denoiser=transformer, version=family)
    with torch.no_grad():
        return family_of(model).predict(model, noisy, sigmas, text, None, cfg)


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_a_flow_lora_reproduces_the_trained_transformer_in_diffusers(tmp_path, monkeypatch,
                                                                     family):
    """The file written at the end of a run, loaded by the family's diffusers pipeline into a
    fresh copy of the base model, gives the trained transformer's output (1e-5)."""
    network = {"train_text_encoder": True, "network_alpha": 2.0, "network_dim": 4}
    if family == "flux1":  # diffusers' FLUX.1 converter splits linear1 at FLUX.1's real widths
        network["train_blocks"] = "double"
    cfg = flow_config(tmp_path, family, network=network, optimizer={"learning_rate": 1e-2})
    trained = {}
    real_save = LoraMethod.save

    def save(self, path, model, facts, final=True):
        if final:
            trained["out"] = predict(model.unet, family, cfg)
        return real_save(self, path, model, facts, final)

    monkeypatch.setattr(LoraMethod, "save", save)
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    pipe = PIPELINES[family].from_pretrained(resolve_model_path(MODELS[family]),
                                             local_files_only=True)
    before = predict(pipe.transformer, family, cfg)
    pipe.load_lora_weights(result.output_path)
    after = predict(pipe.transformer, family, cfg)
    assert (after - before).abs().max() > 1e-3  # the LoRA moved the output
    torch.testing.assert_close(after, trained["out"], atol=1e-5, rtol=1e-5)
    with safe_open(result.output_path, "pt") as f:
        meta, keys = f.metadata(), list(f.keys())
    if family == "flux1":
        assert meta["ss_base_model_version"] == "flux1"
        assert meta["modelspec.architecture"] == "flux-1-dev/lora"
        assert meta["ss_timestep_sampling"] == "flux_shift" and meta["ss_guidance_scale"] == "1.0"
        assert any(k.startswith("lora_unet_double_blocks_0_img_attn_qkv.") for k in keys)
        assert any(k.startswith("lora_te1_") for k in keys)
        assert not any("single_blocks" in k for k in keys)  # train_blocks = double
    else:
        assert meta["ss_base_model_version"] == "5-medium"
        assert meta["modelspec.architecture"] == "stable-diffusion-3-5-medium/lora"
        assert any(k.startswith("transformer.transformer_blocks.0.attn.to_q.") for k in keys)
        assert any(k.startswith("text_encoder_2.") for k in keys)


def test_flux_samples_and_validation_loss_go_through_the_family(tmp_path):
    cfg = flow_config(tmp_path, "flux1", sampling={"sample_prompts": ["a red circle"],
                                                   "sample_every_n_steps": 2,
                                                   "sample_steps": 2},
                      dataset={"validation_split": 0.5, "cache_text_encoder_outputs": True},
                      training={"max_train_steps": 2})
    data = tmp_path / "data" / "1_circle"
    (data / "circle.png").rename(data / "a.png")
    (data / "circle.txt").rename(data / "a.txt")
    one_image_dataset(tmp_path / "more")
    (tmp_path / "more" / "1_circle" / "circle.png").rename(data / "b.png")
    (tmp_path / "more" / "1_circle" / "circle.txt").rename(data / "b.txt")
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    samples = sink.of(Sample)
    assert samples and all(p.endswith(".png") for s in samples for p in s.paths)
    losses = [v.loss for v in sink.of(Validation)]
    assert losses and all(0 < loss < 10 for loss in losses)


def test_the_family_rules_run_again_once_a_checkpoint_is_read(tmp_path):
    """A folder path names no family: the DDPM option passes at load and is refused by the
    run once the model reads as FLUX.1, before anything trains."""
    folder = resolve_model_path(MODELS["flux1"])
    cfg = flow_config(tmp_path, "flux1", model={"pretrained_model_name_or_path": str(folder)},
                      training={"min_snr_gamma": 5.0})
    result = run(cfg, ListSink())
    assert result.status == "failed" and result.step == 0
    assert "training.min_snr_gamma is a DDPM option; FLUX.1 trains with flow matching" \
        in result.error


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_dreambooth_writes_a_single_file_and_a_folder_equal_to_the_trained_model(
        tmp_path, monkeypatch, family):
    """The transformer trains whole; diffusers reads back the original-layout file
    (``from_single_file``) and the folder (``from_pretrained``) equal to what trained."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    cfg = flow_config(tmp_path, family, training={"max_train_steps": 2},
                      optimizer={"learning_rate": 1e-3})
    cfg = cfg.model_copy(update={"mode": "dreambooth"})
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    folder = result.output_path.removesuffix(".safetensors")
    pipe = PIPELINES[family].from_pretrained(folder, local_files_only=True)
    base = PIPELINES[family].from_pretrained(resolve_model_path(MODELS[family]),
                                             local_files_only=True)
    trained = predict(pipe.transformer, family, cfg)
    assert (trained - predict(base.transformer, family, cfg)).abs().max() > 1e-4
    cls = FluxTransformer2DModel if family == "flux1" else SD3Transformer2DModel
    if family == "flux1":
        scale_diffusers_flux_split(monkeypatch)
    single = cls.from_single_file(result.output_path, subfolder="transformer",
                                  config=str(resolve_model_path(MODELS[family])),
                                  local_files_only=True)
    torch.testing.assert_close(predict(single, family, cfg), trained, atol=1e-5, rtol=1e-5)


def single_file_model(tmp_path, family: str) -> dict:
    """The tiny model as users have the real ones: FLUX.1's transformer alone in BFL's layout
    with separate ae / clip_l / t5xxl files; SD 3.5 as one file with its text encoders."""
    from safetensors.torch import save_file

    from trainer.families.common.mmdit_checkpoint import (
        clip_tensors,
        save_flow_checkpoint,
        t5_tensors,
        vae_tensors,
    )

    folder = resolve_model_path(MODELS[family])
    parts = PIPELINES[family].from_pretrained(folder, local_files_only=True).components
    model = {"config_dir": str(folder), "tokenizer": str(folder)}
    if family == "sd3":
        path = save_flow_checkpoint(tmp_path / "sd3.5_medium.safetensors", parts, "sd35-medium",
                                    parts=["transformer", "vae", "clip_l", "clip_g", "t5xxl"],
                                    dtype=None)
        return {**model, "pretrained_model_name_or_path": str(path)}
    path = save_flow_checkpoint(tmp_path / "flux1-dev.safetensors", parts, "flux1-dev",
                                dtype=None)
    for name, tensors in (("ae", vae_tensors(parts["vae"])),
                          ("clip_l", clip_tensors(parts["text_encoder"])),
                          ("t5xxl", t5_tensors(parts["text_encoder_2"]))):
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / f"{name}.st"))
        model[name] = str(tmp_path / f"{name}.st")
    return {**model, "pretrained_model_name_or_path": str(path)}


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_lora_and_dreambooth_train_from_single_files(tmp_path, family):
    model = single_file_model(tmp_path, family)
    for mode in ("lora", "dreambooth"):
        cfg = flow_config(tmp_path, family, model=model, training={"max_train_steps": 2},
                          saving={"output_name": mode})
        sink = ListSink()
        result = run(cfg.model_copy(update={"mode": mode}), sink)
        assert result.status == "finished", result.error
        assert Path(result.output_path).is_file()
        described = "FLUX.1-dev, guidance-distilled" if family == "flux1" else "SD 3.5 medium"
        assert any(described in log.message for log in sink.of(Log)), mode


def test_a_flow_version_on_an_sd_model_names_the_model_setting(tmp_path):
    """The real-size presets name model_version = flux1 and leave the model to the user: run
    as they are, they say which setting to point at a FLUX.1 model."""
    cfg = flow_config(tmp_path, "flux1", model={"pretrained_model_name_or_path":
                                                "embedded:tiny-sd15", "model_version": "flux1"})
    result = run(cfg, ListSink())
    assert result.status == "failed" and result.step == 0
    assert "model.model_version = 'flux1', but model.pretrained_model_name_or_path holds a " \
           "SD 1.x model" in result.error


def test_text_encoder_outputs_kept_on_disk_are_read_back_by_the_next_run(tmp_path):
    """T5's outputs are the slow part of a FLUX.1 start: with the disk cache the second run
    encodes no caption and trains the same; a change of the T5 length encodes again."""
    from trainer.events import Step

    def once(name: str, **model):
        cfg = flow_config(tmp_path, "flux1", model=model, training={"max_train_steps": 2},
                          dataset={"cache_text_encoder_outputs_to_disk": True,
                                   "cache_dir": str(tmp_path / "cache")},
                          saving={"output_name": name})
        sink = ListSink()
        assert run(cfg, sink).status == "finished"
        ready = [log.message for log in sink.of(Log) if "Text-encoder cache" in log.message]
        return ready[0], [e.loss for e in sink.of(Step)]

    first, losses = once("a")
    # on the CPU the first epoch encodes as it goes (trainer/run/caches.py)
    assert first.startswith("Text-encoder cache: 1 caption(s) to encode")
    assert len(list((tmp_path / "cache").glob("te-*.safetensors"))) == 1
    again, same = once("b")
    assert again.startswith("Text-encoder cache: 0 caption(s) to encode") and same == losses
    other, _ = once("c", t5xxl_max_token_length=64)
    assert other.startswith("Text-encoder cache: 1 caption(s) to encode")


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_an_fp8_lora_trains_the_same_whether_stored_at_load_or_after_the_adapters(
        tmp_path, family, monkeypatch):
    """model.base_precision = "fp8" from a single file stores the transformer in fp8 as it
    loads, before the adapters exist (issue 29); it used to be stored after them. peft still
    makes the adapters in the compute precision (the stored layers' compute_dtype), so both
    ways start from the same adapters and end in the same LoRA, bit for bit."""
    from safetensors.torch import load_file

    from trainer.families.common import mmdit_single_file as flow_single_file

    model = {**single_file_model(tmp_path, family), "base_precision": "fp8"}
    streaming = flow_single_file.load_flow_components
    files: dict[str, dict[str, torch.Tensor]] = {}
    for when in ("at load", "after the adapters"):
        if when == "after the adapters":
            monkeypatch.setattr(flow_single_file, "load_flow_components",
                                lambda *a, **k: streaming(*a, **{**k, "fp8_transformer": False}))
        cfg = flow_config(tmp_path / when, family, model=model,
                          training={"max_train_steps": 2, "mixed_precision": "bf16"})
        result = run(cfg, ListSink())
        assert result.status == "finished", result.error
        files[when] = load_file(result.output_path)
    assert files["at load"].keys() == files["after the adapters"].keys()
    for key, tensor in files["at load"].items():
        assert torch.equal(tensor, files["after the adapters"][key]), key
