"""Qwen-Image on its tiny twin, held to diffusers' ``QwenImagePipeline``: the conditioning is the
pipeline's ``encode_prompt``, the denoiser call is the pipeline's transformer call at a fixed
timestep, the latents are the pipeline's own normalization (the inverse of its decode), and the
family is detected from its folder, its edit variants too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import QwenImagePipeline

from trainer.config import ModelSection
from trainer.families import detect_path, family
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
TWIN = "embedded:tiny-qwen-image"
CAPTIONS = ["a red circle on a blue square", "a shape"]


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))


@pytest.fixture(scope="module")
def pipe():
    return QwenImagePipeline.from_pretrained(resolve_model_path(TWIN), local_files_only=True)


def test_the_folder_is_qwen_image(model):
    assert detect_path(resolve_model_path(TWIN)).family == "qwen_image"
    assert model.version == "qwen_image" and model.variant == "base"


def test_conditioning_is_the_pipelines_encode_prompt(model, pipe):
    with torch.no_grad():
        text = family("qwen_image").encode(model, CAPTIONS, 0)
        embeds, mask = pipe.encode_prompt(CAPTIONS, device="cpu", max_sequence_length=512)
    assert mask is not None and not mask.all()  # the captions differ in length: a real mask
    torch.testing.assert_close(text.hidden, embeds, rtol=0, atol=0)
    assert torch.equal(text.mask, mask.long())


def test_predict_is_the_pipelines_transformer_call(model, pipe):
    """What the pipeline's loop passes at t: packed latents, ``timestep / 1000``, the mask and
    ``img_shapes``; unpacked as its ``_unpack_latents`` does."""
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(2, 16, 8, 6, generator=gen)
    t = torch.tensor([700.0, 700.0])
    with torch.no_grad():
        text = family("qwen_image").encode(model, CAPTIONS, 0)
        ours = family("qwen_image").predict(model, noisy, t / 1000, text, None)
        embeds, mask = pipe.encode_prompt(CAPTIONS, device="cpu", max_sequence_length=512)
        packed = pipe._pack_latents(noisy, 2, 16, 8, 6)
        theirs = pipe.transformer(hidden_states=packed, timestep=t / 1000, guidance=None,
                                  encoder_hidden_states_mask=mask, encoder_hidden_states=embeds,
                                  img_shapes=[[(1, 4, 3)]] * 2, attention_kwargs={},
                                  return_dict=False)[0]
        theirs = pipe._unpack_latents(theirs, 8 * pipe.vae_scale_factor,
                                      6 * pipe.vae_scale_factor, pipe.vae_scale_factor)
    assert ours.shape == noisy.shape
    torch.testing.assert_close(ours, theirs[:, :, 0], rtol=0, atol=1e-6)


def test_latents_are_the_pipelines_normalization(model, pipe):
    """Encoding then the pipeline's own decode step (``latents / (1 / std) + mean``, then the
    VAE) gives what the VAE decodes from its raw latents."""
    gen = torch.Generator().manual_seed(5)
    pixels = torch.rand(1, 3, 64, 48, generator=gen) * 2 - 1
    vae = pipe.vae
    with torch.no_grad():
        ours = family("qwen_image").encode_latents(model.vae, pixels)
        raw = vae.encode(pixels.unsqueeze(2)).latent_dist.mode()
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
        back = ours.unsqueeze(2) / inv_std + mean  # pipeline_qwenimage.py's decode
    assert ours.shape == (1, 16, 8, 6)
    torch.testing.assert_close(back, raw, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, raw[:, :, 0])  # the normalization did something


def test_samples_decode_through_the_pipeline(model):
    """The family's pipeline draws from the model's modules (its own unpack and decode)."""
    pipe = family("qwen_image").pipeline(model, model.denoiser, model.noise_scheduler)
    pipe.set_progress_bar_config(disable=True)
    image = pipe("a shape", height=32, width=32, num_inference_steps=2,
                 generator=torch.Generator().manual_seed(0), output_type="np").images[0]
    assert image.shape == (32, 32, 3) and np.isfinite(image).all()


def test_the_default_shift_is_musubis_qwen_shift(model):
    """``flux_shift`` (the default) follows the model scheduler's dynamic shift: for Qwen-Image
    mu runs linearly from 0.5 at 256 packed tokens to 0.9 at 8192 (musubi-tuner's
    ``qwen_shift``, ``trainer_base.py``), then ``e^mu / (e^mu + 1 / t - 1)`` of a sigmoid
    normal draw."""
    import math

    from trainer.config.sections.flow import FlowSection
    from trainer.config.sections.training import TrainingSection
    from trainer.objectives.flow_matching import FlowObjective

    flow = FlowSection()
    assert flow.timestep_sampling == "flux_shift"
    latents = torch.zeros(4, 16, 128, 96)  # 1024 x 768 px: 64 x 48 = 3072 packed tokens
    torch.manual_seed(0)
    got = FlowObjective(flow, TrainingSection(), model.noise_scheduler).sample_t(latents)
    torch.manual_seed(0)
    t = torch.sigmoid(torch.randn(4))
    mu = 0.5 + (0.9 - 0.5) * (3072 - 256) / (8192 - 256)
    expected = math.exp(mu) / (math.exp(mu) + (1 / t - 1))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("settings, words", [
    ({"network": {"train_text_encoder": True}}, "network.train_text_encoder: a Qwen-Image LoRA"),
    ({"training": {"mixed_precision": "fp16"}}, "cannot train Qwen-Image"),
])
def test_the_rules_refuse_what_qwen_image_cannot_train(tmp_path, settings, words):
    from train_helpers import small_config

    from trainer.config.files import ConfigError

    with pytest.raises(ConfigError, match=words):
        small_config(tmp_path, tmp_path, model={"pretrained_model_name_or_path": TWIN},
                     **settings)


def test_samples_guide_with_the_pipelines_true_cfg(tmp_path):
    """[sampling]'s guidance scale (and a prompt's --l) is QwenImagePipeline's true_cfg_scale,
    which guides with the negative prompt; its guidance_scale is for distilled models."""
    from train_helpers import small_config

    from trainer.run.sample_prompts import sample_prompts
    from trainer.run.sampling import _call_args

    cfg = small_config(tmp_path, tmp_path, model={"pretrained_model_name_or_path": TWIN},
                       sampling={"sample_prompts": ["a shape --n blur --l 3.5"]})
    spec = sample_prompts(cfg)[0]
    args = _call_args(type("M", (), {"version": "qwen_image"})(), cfg, None, spec, 0)
    assert args["true_cfg_scale"] == 3.5 and args["negative_prompt"] == "blur"
    assert "guidance_scale" not in args


def test_the_shipped_configs_are_the_published_sizes():
    """trainer/assets/families/qwen-image: the 20.43B transformer, Qwen2.5-VL-7B's 8.29B (its
    vision tower included, as the released file holds it), the Wan 2.1 VAE's 126.9M."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from trainer.families import spec

    root = spec("qwen_image").assets()
    with init_empty_weights():
        parts = {
            "transformer": QwenImageTransformer2DModel.from_config(
                QwenImageTransformer2DModel.load_config(root, subfolder="transformer")),
            "vae": AutoencoderKLQwenImage.from_config(
                AutoencoderKLQwenImage.load_config(root, subfolder="vae")),
            "text_encoder": Qwen2_5_VLForConditionalGeneration(
                Qwen2_5_VLConfig.from_pretrained(root / "text_encoder"))}
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}
    assert counts == {"transformer": 20_430_401_088, "vae": 126_892_531,
                      "text_encoder": 8_292_166_656}
    assert parts["text_encoder"].config.text_config.hidden_size == \
        parts["transformer"].config.joint_attention_dim


@pytest.mark.parametrize("pipeline, zero_cond_t, variant", [
    ("QwenImageEditPipeline", False, "edit"),
    ("QwenImageEditPlusPipeline", False, "edit-2509"),
    ("QwenImageEditPlusPipeline", True, "edit-2511"),
])
def test_an_edit_folder_loads_as_its_variant(tmp_path, pipeline, zero_cond_t, variant):
    """The edit pipelines' folders are Qwen-Image's family, told apart by the pipeline and
    2511's ``zero_cond_t``, and load with their processor (tests/test_qwen_image_edit.py
    trains them); an edit folder without its processor names the folder."""
    import json
    import shutil

    from trainer.families import ModelLoadError

    folder = tmp_path / "edit"
    shutil.copytree(resolve_model_path("embedded:tiny-qwen-image-edit"), folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps(dict(index, _class_name=pipeline)))
    config = json.loads((folder / "transformer" / "config.json").read_text())
    (folder / "transformer" / "config.json").write_text(
        json.dumps(dict(config, zero_cond_t=zero_cond_t)))
    assert detect_path(folder).family == "qwen_image"
    loaded = load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
    assert loaded.variant == variant and loaded.processor is not None
    assert loaded.denoiser.config.zero_cond_t == zero_cond_t
    shutil.rmtree(folder / "processor")
    with pytest.raises(ModelLoadError, match="cannot load the diffusers folder"):
        load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
