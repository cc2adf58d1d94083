"""Samples during training for Qwen-Image-Edit take a control image per prompt (``--ci``), as
FLUX.1 Kontext's do, drawn through the variant's diffusers pipeline as diffusers draws them:
``QwenImageEditPipeline`` (Edit, one control) and ``QwenImageEditPlusPipeline`` (2509, several).
The edit pipelines resize a control to about 1024 x 1024 for the VAE, which takes the tiny
VAE tens of seconds on a CPU; the tests shrink that area in diffusers' own module for both
our sample and the pipeline's reference, so both run the same code on small controls."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit_module
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus_module
from PIL import Image
from test_qwen_image_edit import TWIN, plus_model

from trainer.config import ModelSection, TrainConfig
from trainer.models.loader import load_base_model
from trainer.run.sampling import make_samples

pytestmark = pytest.mark.usefixtures("no_network")
PROMPT = "put a red circle on it --d 3 --s 2"
ACCELERATOR = SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m,
                              autocast=contextlib.nullcontext, is_main_process=True)


@pytest.fixture(autouse=True)
def small_controls(monkeypatch):
    """The pipelines' control area, 1024 x 1024, as 64 x 64 (for ours and the reference)."""
    real = edit_module.calculate_dimensions
    monkeypatch.setattr(edit_module, "calculate_dimensions",
                        lambda area, ratio: real(64 * 64, ratio))
    monkeypatch.setattr(plus_module, "VAE_IMAGE_SIZE", 64 * 64)


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))


def controls(tmp_path) -> list:
    """Two control images of their own sizes and colours, written as PNG files."""
    paths = []
    for i, (size, colour) in enumerate((((64, 48), (30, 60, 200)), ((48, 64), (200, 200, 40)))):
        paths.append(tmp_path / f"control_{i}.png")
        Image.new("RGB", size, colour).save(paths[-1])
    return paths


def samples(model, tmp_path, lines: list[str]) -> list[Image.Image]:
    cfg = TrainConfig(model={"pretrained_model_name_or_path": model.source},
                      dataset={"resolution": 64},
                      sampling={"sample_prompts": lines},
                      saving={"output_dir": str(tmp_path / "out")})
    return [Image.open(p).convert("RGB") for p in make_samples(model, cfg, 0, ACCELERATOR)]


def reference(cls, model, image) -> Image.Image:
    """The pipeline's own sample of PROMPT with ``image``, seed 3, 2 steps, 64 x 64."""
    from trainer.config.sections.outputs import SamplingSection

    pipe = cls(scheduler=model.noise_scheduler.__class__.from_config(
        model.noise_scheduler.config), vae=model.vae, text_encoder=model.text_encoder,
        tokenizer=model.tokenizer, processor=model.processor, transformer=model.denoiser)
    with torch.no_grad():
        return pipe(prompt="put a red circle on it", image=image, height=64, width=64,
                    num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(3),
                    true_cfg_scale=SamplingSection().sample_guidance_scale).images[0]


def test_an_edit_sample_reads_its_control_as_the_edit_pipeline_does(model, tmp_path):
    first, _ = controls(tmp_path)
    with_control, without = samples(model, tmp_path, [f"{PROMPT} --ci {first}", PROMPT])
    assert with_control.tobytes() != without.tobytes()
    theirs = reference(QwenImageEditPipeline, model, Image.open(first).convert("RGB"))
    assert with_control.tobytes() == theirs.tobytes()


def test_2509_samples_read_every_control_as_the_plus_pipeline_does(tmp_path, tmp_path_factory):
    plus = plus_model(tmp_path_factory)
    first, second = controls(tmp_path)
    both, one = samples(plus, tmp_path, [f"{PROMPT} --ci {first} --ci {second}",
                                         f"{PROMPT} --ci {first}"])
    assert both.tobytes() != one.tobytes()
    images = [Image.open(p).convert("RGB") for p in (first, second)]
    assert both.tobytes() == reference(QwenImageEditPlusPipeline, plus, images).tobytes()


def test_a_text_to_image_model_draws_from_the_prompt_alone(tmp_path):
    """Qwen-Image (not an edit model) ignores a prompt's control, as an option it does not
    read."""
    base = load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-qwen-image"))
    first, _ = controls(tmp_path)
    with_control, without = samples(base, tmp_path, [f"{PROMPT} --ci {first}", PROMPT])
    assert with_control.tobytes() == without.tobytes()
