"""FLUX.2 [dev] on its tiny twin (``embedded:tiny-flux2-dev``, a ``Flux2Pipeline`` folder):
the prompt goes through Mistral-Small-3 as the pipeline encodes it (``encode_prompt``, exactly),
the denoiser call is the pipeline's transformer call with its guidance value, and the
family's refusal of a one-GPU full fine-tune is tied to the published model's width."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from trainer.config import ModelSection, TrainConfig
from trainer.config.rules.family import family_problems
from trainer.families import detect_path, embedded_family, family
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
TINY = "embedded:tiny-flux2-dev"
CAPTIONS = ["a red circle [IMG] on blue", "a shape"]


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path=TINY))


def pipeline(model):
    return family("flux2").pipeline(model, model.denoiser, model.noise_scheduler)


def test_the_dev_twin_is_a_flux2_pipeline_folder(model):
    folder = resolve_model_path(TINY)
    assert folder.name == "tiny-flux2-dev" and embedded_family(TINY) == "flux2"
    assert detect_path(folder).family == "flux2"
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == \
        "Flux2Pipeline"
    assert model.version == "flux2" and model.variant == "dev"
    assert model.description.startswith("FLUX.2 [dev]")
    assert type(pipeline(model)).__name__ == "Flux2Pipeline"
    assert model.denoiser.config.guidance_embeds  # dev has a guidance embedder
    assert type(model.text_encoder).__name__ == "Mistral3ForConditionalGeneration"
    assert model.text_encoder.config.text_config.num_hidden_layers > 30  # layer 30 is read


def test_the_prompt_takes_the_pipelines_chat_form(model):
    """ComfyUI's literal form of dev's prompt (``comfy/text_encoders/flux.py``), BOS first,
    ``[IMG]`` taken out, left-padded to 512."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    batch = model.tokenizer.apply_chat_template(
        format_input(CAPTIONS[:1]), tokenize=True, return_dict=True, return_tensors="pt",
        padding="max_length", truncation=True, max_length=512)
    ids, mask = batch["input_ids"][0], batch["attention_mask"][0]
    assert ids.shape == (512,) and mask[0] == 0 and mask[-1] == 1  # padded on the left
    text = model.tokenizer.decode(ids[mask.bool()])
    assert text == (f"<s>[SYSTEM_PROMPT]{SYSTEM_MESSAGE}[/SYSTEM_PROMPT]"
                    f"[INST]a red circle  on blue[/INST]")


def test_conditioning_equals_the_pipelines_encode_prompt(model):
    text = family("flux2").encode(model, list(CAPTIONS), clip_skip=1)
    with torch.no_grad():
        expected, _ = pipeline(model).encode_prompt(list(CAPTIONS), device="cpu")
    width = model.text_encoder.config.text_config.hidden_size
    assert text.mask is None and text.hidden.shape == (2, 512, 3 * width)
    torch.testing.assert_close(text.hidden, expected, rtol=0, atol=0)
    assert not torch.equal(text.hidden[..., :width], text.hidden[..., width:2 * width])


def test_predict_equals_the_pipelines_transformer_call_with_its_guidance(model):
    calls = []

    def catch(module, args, kwargs, output):
        calls.append((kwargs, output[0]))

    handle = model.denoiser.register_forward_hook(catch, with_kwargs=True)
    try:
        with torch.no_grad():
            pipeline(model)(prompt=list(CAPTIONS), height=64, width=64, num_inference_steps=2,
                            guidance_scale=2.5, output_type="latent",
                            generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    from diffusers import Flux2Pipeline as Pipe

    kwargs, out = calls[1]
    assert torch.equal(kwargs["guidance"], torch.full((2,), 2.5))
    b, n, c = kwargs["hidden_states"].shape
    unpack = lambda x: x.permute(0, 2, 1).reshape(b, c, 4, 4)  # noqa: E731
    text = family("flux2").encode(model, list(CAPTIONS), clip_skip=1)
    sigma = kwargs["timestep"]
    noisy = Pipe._unpatchify_latents(unpack(kwargs["hidden_states"]))
    with torch.no_grad():
        ours = family("flux2", guidance=2.5).predict(model, noisy, sigma, text, None)
        other = family("flux2", guidance=1.0).predict(model, noisy, sigma, text, None)
    torch.testing.assert_close(Pipe._patchify_latents(ours), unpack(out), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours, other)  # the guidance value reaches the embedder


def test_training_reads_flux1s_guidance_setting(model):
    """dev trains with ``flow.guidance_scale`` (FLUX.1's setting, 1.0 by default)."""
    cfg = TrainConfig.model_validate({"model": {"pretrained_model_name_or_path": TINY},
                                      "flow": {"guidance_scale": 2.5}})
    torch.manual_seed(0)
    noisy, t = torch.randn(1, 8, 8, 8), torch.tensor([0.4])
    text = family("flux2").encode(model, ["a shape"], clip_skip=1)
    with torch.no_grad():
        got = family("flux2").predict(model, noisy, t, text, None, cfg=cfg)
        want = family("flux2", guidance=2.5).predict(model, noisy, t, text, None)
    assert torch.equal(got, want)


def real_dev_folder(tmp_path):
    """A folder with the published dev transformer's config (no weights: the rule reads the
    config alone)."""
    from trainer.families import spec

    folder = tmp_path / "FLUX.2-dev"
    shutil.copytree(spec("flux2").assets("dev"), folder)
    return str(folder)


def rules_config(path, mode="dreambooth", version="auto", **training):
    """(auto: the family is known once the model loads, when the run checks again)"""
    return TrainConfig.model_validate({
        "mode": mode, "model": {"pretrained_model_name_or_path": path,
                                "model_version": version}, "training": training})


def test_a_full_finetune_of_dev_needs_fsdp(tmp_path):
    real = real_dev_folder(tmp_path)
    problems = family_problems(rules_config(real), "flux2")
    assert len(problems) == 1 and "FLUX.2 [dev]" in problems[0]
    assert "training.distributed = 'fsdp'" in problems[0] and "mode = 'lora'" in problems[0]
    with pytest.raises(ValueError, match="FLUX.2 \\[dev\\] on one GPU"):
        rules_config(real, version="flux2")  # named: refused when the config loads
    assert family_problems(rules_config(real, distributed="fsdp", num_processes=2),
                           "flux2") == []
    assert family_problems(rules_config(real, mode="lora"), "flux2") == []
    # the rule is about the published size: the tiny dev twin fine-tunes on one process
    assert family_problems(rules_config(TINY), "flux2") == []


def test_a_dev_folder_trains_text_first(tmp_path, monkeypatch):
    """From a diffusers folder too, Mistral encodes the captions and is released before the
    transformer is read (dev's 32B transformer and 24B text encoder never share memory)."""
    from train_helpers import one_image_dataset, small_config

    from trainer.events import ListSink
    from trainer.families import family_of
    from trainer.families.flux2 import load
    from trainer.run import caches, text_first
    from trainer.run.loop import run

    seen, real_fill, real_read = {}, caches.fill_text_cache, load._folder_transformer

    def fill(s, out, **kwargs):
        seen["session"] = s
        real_fill(s, out, **kwargs)

    def read(*args, **kwargs):
        model = seen["session"].model
        seen["released"] = [text_first.released(enc) for _, enc, _ in
                            family_of(model).text_encoders(model)]
        return real_read(*args, **kwargs)

    monkeypatch.setattr(caches, "fill_text_cache", fill)
    monkeypatch.setattr(load, "_folder_transformer", read)
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, model={"pretrained_model_name_or_path": TINY},
                       training={"max_train_steps": 2, "mixed_precision": "no"})
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    assert seen["released"] == [True]


def test_the_dev_twin_fine_tunes_under_fsdp(tmp_path, model):
    """The case the refusal points to: DreamBooth of dev sharded over 2 gloo processes (the
    transformer's blocks as FSDP units); the file it writes is dev's, trained."""
    from safetensors.torch import load_file
    from test_fsdp import dreambooth

    from trainer.events import ListSink, Step
    from trainer.families.flux2.checkpoint import bfl_tensors
    from trainer.run.launch import run_launched

    cfg = dreambooth(tmp_path, "dev", model={"pretrained_model_name_or_path": TINY},
                     training={"num_processes": 2, "train_batch_size": 1, "max_train_steps": 2,
                               "distributed": "fsdp", "mixed_precision": "no",
                               "gradient_checkpointing": True})
    assert family_problems(cfg, "flux2") == []
    sink = ListSink()
    result = run_launched(cfg, sink)
    assert result.status == "finished" and result.step == 2, result.error
    assert [e.step for e in sink.of(Step)] == [1, 2]
    assert detect_path(result.output_path).header.variant == "dev"
    trained, base = load_file(result.output_path), bfl_tensors(model.denoiser)
    assert trained.keys() == base.keys()
    assert any(not torch.equal(trained[k].float(), base[k].to(trained[k].dtype).float())
               for k in base)
