"""Chroma (trainer/families/chroma/) against diffusers' own ChromaPipeline on the tiny twin:
the prompt encoding, the denoiser call, detection of its single file (and FLUX.1's detection
not claiming it), the single file's round trip through our writer and loader and diffusers'
own reader."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelSection
from trainer.families import detect_path, family
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.models.text_conditioning import TextConditioning

pytestmark = pytest.mark.usefixtures("no_network")
CAPTIONS = ["a red circle", "a shape 1 on the left side of a big square"]


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-chroma"))


@pytest.fixture(scope="module")
def pipe(model):
    return family("chroma").pipeline(model, model.denoiser, model.noise_scheduler)


def test_the_embedded_twin_loads_as_chroma(model):
    assert (model.version, model.variant, model.t5_max_length) == ("chroma", "hd", 512)
    assert type(model.denoiser).__name__ == "ChromaTransformer2DModel"
    assert detect_path(resolve_model_path("embedded:tiny-chroma")).family == "chroma"


def test_encode_is_the_pipelines_encode_prompt(model, pipe):
    text = family("chroma").encode(model, CAPTIONS, 1)
    hidden, _, mask, *_ = pipe.encode_prompt(CAPTIONS, do_classifier_free_guidance=False)
    assert torch.equal(text.hidden, hidden)
    assert text.pooled is None
    assert torch.equal(text.mask.to(mask.dtype), mask)  # the real tokens and one padding token
    ids = model.tokenizer(CAPTIONS).input_ids
    assert text.lengths() == [len(i) + 1 for i in ids]


def _pipeline_call(pipe, caption: str) -> dict:
    """The keyword arguments of the pipeline's one transformer call (one step, no CFG)."""
    seen: dict = {}

    def hook(module, args, kwargs):
        seen.update(kwargs)

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        pipe(caption, num_inference_steps=1, guidance_scale=1.0, height=64, width=64,
             output_type="latent", generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    return seen


def test_predict_is_the_pipelines_transformer_call(model, pipe):
    """The same inputs as the pipeline's call: packed latents, ids, the sigma as timestep and
    the pipeline's mask positions, given as a boolean mask (the pipeline's float 0/1 tensor is
    added to the attention scores instead: diffusers issue #12116)."""
    fam = family("chroma")
    seen = _pipeline_call(pipe, CAPTIONS[0])
    with torch.no_grad():  # as the pipeline encodes
        text = fam.encode(model, CAPTIONS[:1], 1)
    n_img = seen["hidden_states"].shape[1]
    assert torch.equal(seen["attention_mask"][:, :-n_img].bool(), text.mask.bool())
    assert torch.equal(seen["encoder_hidden_states"], text.hidden)
    with torch.no_grad():
        reference = model.denoiser(**dict(seen, attention_mask=seen["attention_mask"].bool()))[0]
        latents = pipe._unpack_latents(seen["hidden_states"], 64, 64, pipe.vae_scale_factor)
        ours = fam.predict(model, latents, seen["timestep"], text, None)
    expected = pipe._unpack_latents(reference, 64, 64, pipe.vae_scale_factor)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_a_batch_of_two_lengths_is_each_caption_alone(model):
    """Captions of different lengths in one batch (masked), in the text cache's form (real
    tokens only, padded to the longest) and one at a time agree, with and without gradient
    checkpointing (whose single blocks diffusers calls without the mask)."""
    fam = family("chroma")
    with torch.no_grad():
        text = fam.encode(model, CAPTIONS, 1)
    cached = TextConditioning.padded(text.rows())
    noisy = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        alone = torch.cat([fam.predict(model, noisy[i:i + 1], t[i:i + 1],
                                       TextConditioning(text.hidden[i:i + 1], None,
                                                        text.mask[i:i + 1]), None)
                           for i in range(2)])
        batch = fam.predict(model, noisy, t, text, None)
        from_cache = fam.predict(model, noisy, t, cached, None)
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_cache, alone, atol=1e-5, rtol=1e-5)
    model.denoiser.enable_gradient_checkpointing()
    try:
        checkpointed = fam.predict(model, noisy, t, cached, None).detach()
    finally:
        model.denoiser.disable_gradient_checkpointing()
    torch.testing.assert_close(checkpointed, alone, atol=1e-5, rtol=1e-5)
