"""FLUX.2 klein's own numbers on its tiny twin: the conditioning equals
``Flux2KleinPipeline.encode_prompt``'s, the latents the pipeline's own VAE encoding (patchified,
BatchNorm-normalized), and the family's denoiser call the transformer call the pipeline makes
inside its denoising loop (caught with a hook); the registry detects its folder."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelSection
from trainer.families import detect_path, family
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
CAPTIONS = ["a red circle on blue", "a shape"]


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-flux2"))


def pipeline(model):
    return family("flux2").pipeline(model, model.denoiser, model.noise_scheduler)


def test_the_tiny_twin_is_a_klein_pipeline_folder(model):
    folder = resolve_model_path("embedded:tiny-flux2")
    assert detect_path(folder).family == "flux2"
    assert model.version == "flux2" and model.variant == "klein-4b"
    assert type(pipeline(model)).__name__ == "Flux2KleinPipeline"
    assert not model.denoiser.config.guidance_embeds  # klein has no guidance embedder
    assert model.text_encoder.config.num_hidden_layers > 27  # layer 27 is read


def test_conditioning_equals_the_pipelines_encode_prompt(model):
    text = family("flux2").encode(model, list(CAPTIONS), clip_skip=1)
    with torch.no_grad():
        expected, text_ids = pipeline(model).encode_prompt(list(CAPTIONS), device="cpu")
    assert text.mask is None  # every position goes to the transformer, padding included
    assert text.hidden.shape == (2, 512, 3 * model.text_encoder.config.hidden_size)
    torch.testing.assert_close(text.hidden, expected, rtol=0, atol=0)
    # the three layers differ: each third of a token's features is another layer's
    width = model.text_encoder.config.hidden_size
    assert not torch.equal(text.hidden[..., :width], text.hidden[..., width:2 * width])


def test_latents_equal_the_pipelines_own_encoding(model):
    torch.manual_seed(0)
    pixels = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        ours = family("flux2").encode_latents(model.vae, pixels)
        theirs = pipeline(model)._encode_vae_image(pixels, generator=None)
        raw = model.vae.encode(pixels).latent_dist.mode()
    from diffusers import Flux2KleinPipeline

    # kept at [B, C, H/8, W/8] as every family's latents; patchified, the pipeline's
    assert ours.shape == (1, model.vae.config.latent_channels, 8, 8)
    torch.testing.assert_close(Flux2KleinPipeline._patchify_latents(ours), theirs, rtol=0,
                               atol=0)
    # the BatchNorm statistics are used (the twin's are drawn away from 0 / 1)
    assert not torch.allclose(ours, raw)


def test_predict_equals_the_pipelines_transformer_call(model):
    """The pipeline's first denoising step, caught at the transformer: our predict on the same
    latents (unpacked) at the same timestep gives the same output (unpacked)."""
    calls = []

    def catch(module, args, kwargs, output):
        calls.append((kwargs, output[0]))

    handle = model.denoiser.register_forward_hook(catch, with_kwargs=True)
    try:
        with torch.no_grad():
            pipeline(model)(prompt=list(CAPTIONS), height=64, width=64, num_inference_steps=2,
                            output_type="latent", generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    from diffusers import Flux2KleinPipeline as Pipe

    kwargs, out = calls[1]  # the second step: a sigma below 1
    b, n, c = kwargs["hidden_states"].shape
    unpack = lambda x: x.permute(0, 2, 1).reshape(b, c, 4, 4)  # noqa: E731
    text = family("flux2").encode(model, list(CAPTIONS), clip_skip=1)
    sigma = kwargs["timestep"]
    assert 0 < float(sigma[0]) < 1  # the pipeline passes t / 1000, a sigma
    noisy = Pipe._unpatchify_latents(unpack(kwargs["hidden_states"]))  # our latents' shape
    with torch.no_grad():
        ours = family("flux2").predict(model, noisy, sigma, text, None)
    assert ours.shape == noisy.shape
    torch.testing.assert_close(Pipe._patchify_latents(ours), unpack(out), rtol=1e-5, atol=1e-6)
