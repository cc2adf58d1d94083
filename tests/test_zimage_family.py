"""Z-Image's own numbers on its tiny twin: the conditioning equals ``ZImagePipeline.
encode_prompt``'s, the family's denoiser call equals the pipeline's transformer call (the same
timestep and the negation the pipeline applies), and the registry detects its folder."""

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
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-zimage"))


def pipeline(model):
    return family("zimage").pipeline(model, model.denoiser, model.noise_scheduler)


def test_the_tiny_twin_is_a_zimage_pipeline_folder(model):
    folder = resolve_model_path("embedded:tiny-zimage")
    assert detect_path(folder).family == "zimage"
    assert model.version == "zimage" and model.variant == "turbo"
    assert type(model.text_encoder).__name__ == "Qwen3Model"
    assert not model.noise_scheduler.config.use_dynamic_shifting
    assert model.noise_scheduler.config.shift == 3.0


def test_conditioning_equals_the_pipelines_encode_prompt(model):
    text = family("zimage").encode(model, list(CAPTIONS), clip_skip=1)
    with torch.no_grad():
        expected, _ = pipeline(model).encode_prompt(list(CAPTIONS), device="cpu",
                                                    do_classifier_free_guidance=False)
    assert text.mask is not None and text.lengths() == [e.shape[0] for e in expected]
    assert text.lengths()[0] != text.lengths()[1]  # captions of their own lengths
    for row, want in zip(text.rows(), expected):
        torch.testing.assert_close(row, want, rtol=0, atol=0)
    # padding is zeros after each caption
    short = min(range(2), key=lambda i: text.lengths()[i])
    assert not text.hidden[short, text.lengths()[short]:].any()


def test_predict_equals_the_pipelines_transformer_call(model):
    """The pipeline at scheduler timestep t gives the DiT (1000 - t) / 1000 and negates its
    output; our sigma is t / 1000, and the flow objective's target is noise - latents."""
    torch.manual_seed(0)
    noisy = torch.randn(2, 16, 8, 8)
    t_sched = torch.tensor([750.0, 250.0])
    text = family("zimage").encode(model, list(CAPTIONS), clip_skip=1)
    with torch.no_grad():
        embeds, _ = pipeline(model).encode_prompt(list(CAPTIONS), device="cpu",
                                                  do_classifier_free_guidance=False)
        ours = family("zimage").predict(model, noisy, t_sched / 1000, text, None)
        frames = list(noisy.unsqueeze(2).unbind(dim=0))
        out = model.denoiser(frames, (1000 - t_sched) / 1000, embeds, return_dict=False)[0]
        theirs = -torch.stack([o.float() for o in out], dim=0).squeeze(2)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # the sign: at sigma 1 (pure noise) the velocity points from the latents to the noise
    assert ours.shape == noisy.shape
