"""Qwen-Image-Edit on its tiny twin (``embedded:tiny-qwen-image-edit``), held to diffusers'
``QwenImageEditPipeline`` (and ``QwenImageEditPlusPipeline`` for 2509's several controls): the
conditioning of a prompt with its control image is the pipeline's ``encode_prompt``, the denoiser
call with the control's latents is the pipeline's transformer call cut to the target's tokens, and
the loss reads the target's tokens alone (training on pairs: test_qwen_image_edit_train.py)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
    CONDITION_IMAGE_SIZE,
    calculate_dimensions,
)

from trainer.config import ModelSection
from trainer.families import family
from trainer.families.qwen_image.edit import to_pil
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.models.text_conditioning import TextConditioning

pytestmark = pytest.mark.usefixtures("no_network")
TWIN = "embedded:tiny-qwen-image-edit"
CAPTIONS = ["make the circle blue", "invert it"]


def pixels(seed: int, batch: int, h: int, w: int) -> torch.Tensor:
    """Pixels in [-1, 1] that come from 8-bit values (as the dataset renders them)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, h, w), generator=gen).float() / 127.5 - 1


def pipeline(cls, model):
    return cls.from_pretrained(resolve_model_path(TWIN), processor=model.processor,
                               tokenizer=model.tokenizer, local_files_only=True)


def plus_model(tmp_path_factory):
    """The twin's folder as a QwenImageEditPlusPipeline (what 2509's model_index names)."""
    folder = tmp_path_factory.mktemp("plus") / "edit-2509"
    shutil.copytree(resolve_model_path(TWIN), folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(
        json.dumps(dict(index, _class_name="QwenImageEditPlusPipeline")))
    return load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))


@pytest.fixture(scope="module")
def pipe(model):
    return pipeline(QwenImageEditPipeline, model)


def test_the_twin_is_the_edit_variant_with_its_processor(model):
    assert model.version == "qwen_image" and model.variant == "edit"
    index = json.loads((resolve_model_path(TWIN) / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImageEditPipeline"
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert model.text_encoder.config.vision_config.depth == 1  # the tiny vision tower


def test_conditioning_is_the_pipelines_encode_prompt_with_the_control(model, pipe):
    """The control enters the text encoder: the edit template, the image through the
    processor, the template's first 64 tokens dropped; a different control, other states."""
    control = pixels(1, 2, 64, 96)
    with torch.no_grad():
        text = family("qwen_image").encode(model, CAPTIONS, 0, controls=[control])
        embeds, mask = pipe.encode_prompt(CAPTIONS, image=[to_pil(c) for c in control],
                                          device="cpu")
        other = family("qwen_image").encode(model, CAPTIONS, 0, controls=[-control])
    assert mask is not None and not mask.all()
    torch.testing.assert_close(text.hidden, embeds, rtol=0, atol=0)
    assert torch.equal(text.mask, mask.long())
    assert (other.hidden - text.hidden).abs().max() > 1e-4


def edit_call(transformer, noisy, control, embeds, mask, t):
    """QwenImageEditPipeline's loop at one timestep: the control's packed latents after the
    target's, both in img_shapes, the output cut to the target's tokens and unpacked."""
    b, c, h, w = noisy.shape
    packed = QwenImageEditPipeline._pack_latents(noisy, b, c, h, w)
    image = QwenImageEditPipeline._pack_latents(control, b, c, *control.shape[2:])
    out = transformer(hidden_states=torch.cat([packed, image], dim=1), timestep=t,
                      guidance=None, encoder_hidden_states_mask=mask,
                      encoder_hidden_states=embeds, attention_kwargs={}, return_dict=False,
                      img_shapes=[[(1, h // 2, w // 2),
                                   (1, control.shape[2] // 2, control.shape[3] // 2)]] * b)[0]
    out = out[:, :packed.size(1)]
    return QwenImageEditPipeline._unpack_latents(out, h * 8, w * 8, 8)[:, :, 0]


def test_predict_with_a_control_is_the_pipelines_transformer_call(model, pipe):
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(2, 16, 8, 6, generator=gen)
    control = torch.randn(2, 16, 6, 10, generator=gen)  # its own size, not the target's
    t = torch.tensor([0.7, 0.7])
    with torch.no_grad():
        text = family("qwen_image").encode(model, CAPTIONS, 0, controls=[pixels(2, 2, 48, 80)])
        ours = family("qwen_image").predict(model, noisy, t, text, None, controls=[control])
        theirs = edit_call(pipe.transformer, noisy, control, text.hidden, text.mask, t)
        alone = family("qwen_image").predict(model, noisy, t, text, None)
    assert ours.shape == noisy.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert (ours - alone).abs().max() > 1e-4  # the control's tokens are attended to


class Loud(torch.nn.Module):
    """The transformer, with its output at the reference tokens (after ``tokens``) made huge."""

    def __init__(self, transformer, tokens: int) -> None:
        super().__init__()
        self.inner, self.tokens = transformer, tokens

    def forward(self, **kw):
        out = self.inner(**kw)[0].clone()
        out[:, self.tokens:] = 1e6
        return (out,)


def test_the_loss_reads_the_target_tokens_alone(model):
    """What the transformer gives at the control's tokens never reaches the prediction (so
    neither the loss): a denoiser whose output there is 1e6 predicts the same."""
    gen = torch.Generator().manual_seed(4)
    noisy, control = torch.randn(1, 16, 8, 8, generator=gen), torch.randn(1, 16, 8, 8)
    text = TextConditioning(torch.randn(1, 5, 32, generator=gen))
    t = torch.tensor([0.5])
    with torch.no_grad():
        plain = family("qwen_image").predict(model, noisy, t, text, None, controls=[control])
        loud = family("qwen_image").predict(model, noisy, t, text, None, controls=[control],
                                            denoiser=Loud(model.denoiser, 16))
    torch.testing.assert_close(plain, loud, rtol=0, atol=0)


def test_the_variant_takes_its_number_of_controls(model):
    one = pixels(5, 1, 32, 32)
    with pytest.raises(ValueError, match="needs its control image"):
        family("qwen_image").encode(model, ["x"], 0)
    with pytest.raises(ValueError, match="at most 1 control"):
        family("qwen_image").encode(model, ["x"], 0, controls=[one, one])
    base = SimpleNamespace(variant="base", description="Qwen-Image")
    with pytest.raises(ValueError, match="not an edit model"):
        family("qwen_image").encode(base, ["x"], 0, controls=[one])


def test_plus_takes_several_controls_as_its_pipeline(tmp_path_factory):
    """2509 (QwenImageEditPlusPipeline): ``Picture N:`` per control, each resized to about
    384 x 384 for the text encoder; every control's latents after the target's tokens."""
    plus = plus_model(tmp_path_factory)
    assert plus.variant == "edit-2509"
    pipe = pipeline(QwenImageEditPlusPipeline, plus)
    first, second = pixels(6, 1, 64, 96), pixels(7, 1, 80, 64)
    with torch.no_grad():
        text = family("qwen_image").encode(plus, CAPTIONS[:1], 0, controls=[first, second])
        images = []
        for control in (first, second):  # as the pipeline's __call__ sizes them
            image = to_pil(control[0])
            w, h = calculate_dimensions(CONDITION_IMAGE_SIZE, image.size[0] / image.size[1])
            images.append(pipe.image_processor.resize(image, h, w))
        embeds, mask = pipe.encode_prompt(CAPTIONS[:1], image=images, device="cpu")
    torch.testing.assert_close(text.hidden, embeds, rtol=0, atol=0)
    gen = torch.Generator().manual_seed(8)
    noisy, a, b = (torch.randn(1, 16, *s, generator=gen) for s in ((8, 8), (6, 8), (8, 4)))
    with torch.no_grad():
        ours = family("qwen_image").predict(plus, noisy, torch.tensor([0.3]), text, None,
                                            controls=[a, b])
        packed = [pipe._pack_latents(x, 1, 16, *x.shape[2:]) for x in (noisy, a, b)]
        out = pipe.transformer(hidden_states=torch.cat(packed, dim=1),
                               timestep=torch.tensor([0.3]), encoder_hidden_states=embeds,
                               encoder_hidden_states_mask=mask, return_dict=False,
                               img_shapes=[[(1, 4, 4), (1, 3, 4), (1, 4, 2)]])[0]
        theirs = pipe._unpack_latents(out[:, :16], 64, 64, 8)[:, :, 0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_an_edit_models_samples_are_drawn_from_the_prompt(model):
    from trainer.families.qwen_image.tiny import scheduler

    pipe = family("qwen_image").pipeline(model, model.denoiser, scheduler())
    out = pipe("a red circle", height=32, width=32, num_inference_steps=2, output_type="pt",
               generator=torch.Generator().manual_seed(0)).images
    assert out.shape == (1, 3, 32, 32) and torch.isfinite(out).all()
