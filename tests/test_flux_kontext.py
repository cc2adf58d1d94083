"""FLUX.1 Kontext [dev] (trainer/families/flux/): told from FLUX.1-dev, its tiny twin, and its
denoiser call with a reference image, checked against diffusers' ``FluxKontextPipeline`` (the
inputs built by the pipeline's own ``prepare_latents``, ``encode_prompt`` and id concatenation,
the output cut to the target's tokens as its loop does)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from diffusers import FluxKontextPipeline

from trainer.config import ModelSection, TrainConfig
from trainer.families import detect_path, family, spec
from trainer.families.flux.conditioning import FluxFamily, KontextFamily
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.models.text_conditioning import TextConditioning
from trainer.run.step import batch_loss, encode_images

pytestmark = pytest.mark.usefixtures("no_network")
MODEL = "embedded:tiny-flux-kontext"
GUIDANCE = 2.5


@pytest.fixture(scope="module")
def pipe():
    return FluxKontextPipeline.from_pretrained(resolve_model_path(MODEL), local_files_only=True)


def pipeline_inputs(pipe, target=(64, 96), reference=(96, 64), seed=0):
    """The transformer's inputs as FluxKontextPipeline.__call__ builds them for one prompt, a
    reference image of ``reference`` (w, h) pixels and a target of ``target``."""
    gen = torch.Generator().manual_seed(seed)
    image = torch.rand(1, 3, reference[1], reference[0], generator=gen) * 2 - 1
    embeds, pooled, text_ids = pipe.encode_prompt(prompt="a red circle", prompt_2=None,
                                                  max_sequence_length=16)
    latents, image_latents, latent_ids, image_ids = pipe.prepare_latents(
        image, 1, pipe.transformer.config.in_channels // 4, target[1], target[0],
        embeds.dtype, torch.device("cpu"), gen)
    return SimpleNamespace(image=image, embeds=embeds, pooled=pooled, text_ids=text_ids,
                           latents=latents, image_latents=image_latents,
                           ids=torch.cat([latent_ids, image_ids], dim=0), target=target)


@torch.no_grad()
def pipeline_prediction(pipe, x, sigma: float) -> torch.Tensor:
    """The pipeline's loop body: the target's and the reference's tokens in, the target's out
    (unpacked to the latents' shape)."""
    out = pipe.transformer(hidden_states=torch.cat([x.latents, x.image_latents], dim=1),
                           timestep=torch.tensor([sigma]), guidance=torch.tensor([GUIDANCE]),
                           pooled_projections=x.pooled, encoder_hidden_states=x.embeds,
                           txt_ids=x.text_ids, img_ids=x.ids, return_dict=False)[0]
    out = out[:, :x.latents.size(1)]
    return pipe._unpack_latents(out, x.target[1], x.target[0], pipe.vae_scale_factor)


def as_model(pipe):
    return SimpleNamespace(denoiser=pipe.transformer, vae=pipe.vae, version="flux1_kontext")


def test_a_kontext_folder_is_told_from_flux1_by_its_pipeline_and_takes_one_reference():
    folder = resolve_model_path(MODEL)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == \
        "FluxKontextPipeline"
    assert detect_path(folder).family == "flux1_kontext"
    assert detect_path(resolve_model_path("embedded:tiny-flux")).family == "flux1"
    controls = spec("flux1_kontext").controls
    assert (controls.max, controls.required, controls.multiple) == (1, 0, 16)
    assert spec("flux1").controls.max == 0
    model = load_base_model(ModelSection(pretrained_model_name_or_path=MODEL))
    assert (model.version, model.variant) == ("flux1_kontext", "dev")
    assert isinstance(family(model.version), KontextFamily)


def test_predict_with_a_reference_is_the_pipelines_transformer_call(pipe):
    """Our latents of the reference (encode_images, as the step and the cache encode controls)
    and the unpacked noisy target give the pipeline's prediction for the target's tokens."""
    x = pipeline_inputs(pipe)
    noisy = pipe._unpack_latents(x.latents, x.target[1], x.target[0], pipe.vae_scale_factor)
    model = as_model(pipe)
    kontext = family("flux1_kontext", guidance=GUIDANCE)
    reference = encode_images(pipe.vae, x.image, kontext)
    assert reference.shape[-2:] == (8, 12)  # its own size, not the target's (12 x 8)
    with torch.no_grad():
        ours = kontext.predict(model, noisy, torch.tensor([0.6]),
                               TextConditioning(x.embeds, x.pooled), None, controls=[reference])
    expected = pipeline_prediction(pipe, x, 0.6)
    assert ours.shape == noisy.shape
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the reference is read: without it the output differs
        alone = kontext.predict(model, noisy, torch.tensor([0.6]),
                                TextConditioning(x.embeds, x.pooled), None)
    assert (alone - expected).abs().max() > 1e-4


def test_without_a_reference_kontext_predicts_as_flux1(pipe):
    x = pipeline_inputs(pipe)
    noisy = pipe._unpack_latents(x.latents, x.target[1], x.target[0], pipe.vae_scale_factor)
    text = TextConditioning(x.embeds, x.pooled)
    with torch.no_grad():
        ours = family("flux1_kontext", guidance=GUIDANCE).predict(
            as_model(pipe), noisy, torch.tensor([0.4]), text, None)
        flux = FluxFamily(GUIDANCE).predict(as_model(pipe), noisy, torch.tensor([0.4]), text,
                                            None)
    torch.testing.assert_close(ours, flux, atol=0, rtol=0)


def test_the_loss_is_taken_on_the_targets_tokens_only(pipe, monkeypatch):
    """Whatever the transformer answers at the reference's tokens leaves the loss unchanged;
    what it answers at the target's changes it."""
    x = pipeline_inputs(pipe)
    latents = pipe._unpack_latents(x.latents, x.target[1], x.target[0], pipe.vae_scale_factor)
    cfg = TrainConfig(model={"pretrained_model_name_or_path": MODEL})
    batch = SimpleNamespace(latents=latents, text=TextConditioning(x.embeds, x.pooled),
                            controls=[encode_images(pipe.vae, x.image)], size_ids=None,
                            loss_weights=torch.ones(1), mask=None, rows=None)
    model = as_model(pipe)
    forward = pipe.transformer.forward
    tokens = x.latents.shape[1]

    def loss_with(offset: torch.Tensor) -> float:
        def shifted(*args, **kwargs):
            out = forward(*args, **kwargs)
            return (out[0] + offset[:, :out[0].shape[1]],)

        monkeypatch.setattr(pipe.transformer, "forward", shifted)
        torch.manual_seed(5)
        with torch.no_grad():
            return float(batch_loss(batch, model, cfg, torch.device("cpu"), torch.float32,
                                    family=family("flux1_kontext", guidance=GUIDANCE)))

    total = tokens + x.image_latents.shape[1]
    zero = torch.zeros(1, total, 64)
    on_reference, on_target = zero.clone(), zero.clone()
    on_reference[:, tokens:] = 100.0
    on_target[:, :tokens] = 100.0
    base = loss_with(zero)
    assert loss_with(on_reference) == base
    assert loss_with(on_target) > base + 1.0


@pytest.mark.parametrize("size", [(64, 64), (64, 80), (300, 100), (100, 300), (97, 61)])
def test_a_reference_is_sized_as_the_kontext_pipeline_sizes_it(size):
    """The size a reference trains at is the pipeline's: the preferred resolution nearest its
    aspect (diffusers' own table and rule), sides on multiples of 16."""
    from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

    from trainer.data.control_sizing import ControlSizing, own_size

    aspect = size[0] / size[1]
    _, w, h = min((abs(aspect - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
    sizing = ControlSizing.of_family(spec("flux1_kontext").controls)
    assert own_size(size, sizing) == (w // 16 * 16, h // 16 * 16)


def test_dataset_control_resolution_sizes_the_references_of_a_folder_dataset(tmp_path):
    """dataset.control_resolution: about that side squared at the reference's aspect."""
    from control_helpers import pairs

    from trainer.data import prepare_dataset

    train = pairs(tmp_path, names=("a", "b"), sizes=((64, 64), (64, 128)))

    def control_sizes(**dataset) -> set:
        cfg = TrainConfig(model={"pretrained_model_name_or_path": MODEL},
                          dataset={"train_data_dir": str(train), "resolution": 64,
                                   "bucket_reso_steps": 16, "min_bucket_reso": 64,
                                   "control_dir": "control", "cache_latents": False,
                                   **dataset})
        data = prepare_dataset(cfg, lambda _: None, data_home=tmp_path)
        return {tuple(b.control_pixels[0].shape[-2:]) for b in data.epoch(0, 1, seed=1)}

    assert control_sizes() == {(1024, 1024), (1456, 720)}  # (h, w): the pipeline's sizes
    assert control_sizes(control_resolution=64) == {(64, 64), (80, 32)}
    with pytest.raises(ValueError, match="dataset.control_resolution is set but FLUX.1 is not"):
        TrainConfig(model={"model_version": "flux1"}, dataset={"control_resolution": 64})


def test_a_sample_prompt_names_its_references_as_musubi_tuner_does(tmp_path):
    """``--ci`` once per reference in a prompt line; ``control_image_path`` (a path or a list)
    in a prompt file's entries."""
    from trainer.run.sample_prompts import parse_line, read_prompt_file

    line = parse_line("make it red --ci a.png --d 3 --ci sub/b 1.png --w 512")
    assert line.prompt == "make it red" and (line.seed, line.width) == (3, 512)
    assert line.control_images == ("a.png", "sub/b 1.png")
    assert parse_line("plain --d 1").control_images == ()
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"prompt": "one", "control_image_path": "x.png"},
                                {"prompt": "two", "control_image_path": ["y.png", "z.png"]},
                                "three --ci w.png"]))
    assert [p.control_images for p in read_prompt_file(path)] == [
        ("x.png",), ("y.png", "z.png"), ("w.png",)]
