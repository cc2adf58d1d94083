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
    """diffusers' own ChromaPipeline over the tiny twin."""
    from diffusers import ChromaPipeline

    return ChromaPipeline(scheduler=model.noise_scheduler, vae=model.vae,
                          text_encoder=model.text_encoder, tokenizer=model.tokenizer,
                          transformer=model.denoiser)


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
    """The same inputs as the pipeline's call (packed latents, ids, the sigma as timestep) and
    the pipeline's mask positions, as a boolean mask: the transformer reads the text trimmed to
    them (the pipeline's float 0/1 tensor is added to the attention scores instead: diffusers
    issue #12116)."""
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
        buggy = model.denoiser(**seen)[0]
    expected = pipe._unpack_latents(reference, 64, 64, pipe.vae_scale_factor)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert (pipe._unpack_latents(buggy, 64, 64, pipe.vae_scale_factor) - ours).abs().max() > 1e-3


def test_the_samples_pipeline_gives_the_transformer_the_trimmed_prompt(model):
    """The studio's pipeline (diffusers' loop, CFG and scheduler) hands the transformer each
    prompt's real tokens and one padding token, and the negative prompt's own: its call is
    :meth:`predict`'s."""
    fam = family("chroma")
    ours = fam.pipeline(model, model.denoiser, model.noise_scheduler)
    assert type(ours).__name__ == "ChromaPipeline"
    calls: list[dict] = []
    handle = model.denoiser.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    try:
        ours(CAPTIONS[1], negative_prompt="blurry", num_inference_steps=1, guidance_scale=4.0,
             height=64, width=64, output_type="latent",
             generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    with torch.no_grad():
        texts = [fam.encode(model, [c], 1) for c in (CAPTIONS[1], "blurry")]
    assert len(calls) == 2
    for seen, text in zip(calls, texts):
        assert torch.equal(seen["encoder_hidden_states"], text.rows()[0][None])
        assert bool(seen["attention_mask"].all())
        with torch.no_grad():
            out = model.denoiser(**seen)[0]
            latents = ours._unpack_latents(seen["hidden_states"], 64, 64, ours.vae_scale_factor)
            expected = ours._unpack_latents(out, 64, 64, ours.vae_scale_factor)
            got = fam.predict(model, latents, seen["timestep"], text, None)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


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


# --- the single file in Black Forest Labs' layout ---------------------------------------------


def test_the_shipped_config_is_chroma1s_8_9b():
    import json

    from accelerate import init_empty_weights
    from diffusers import ChromaTransformer2DModel

    from trainer.families import spec

    config = json.loads((spec("chroma").assets() / "transformer" / "config.json").read_text())
    with init_empty_weights():
        transformer = ChromaTransformer2DModel.from_config(config)
    assert round(sum(p.numel() for p in transformer.parameters()) / 1e9, 2) == 8.90


def test_our_layout_is_what_diffusers_and_comfyui_read():
    """A Chroma of the released width (two blocks of each kind, on the meta device) written
    by our writer is consumed whole by diffusers' reader
    (``convert_chroma_transformer_checkpoint_to_diffusers``) into the model's own keys and
    shapes, and carries ComfyUI's Chroma markers (``model_detection.py``)."""
    import json

    from accelerate import init_empty_weights
    from diffusers import ChromaTransformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_chroma_transformer_checkpoint_to_diffusers,
    )

    from trainer.families import spec
    from trainer.families.chroma.checkpoint import chroma_tensors

    config = json.loads((spec("chroma").assets() / "transformer" / "config.json").read_text())
    with init_empty_weights():
        transformer = ChromaTransformer2DModel.from_config(
            dict(config, num_layers=2, num_single_layers=2))
    written = chroma_tensors(transformer)
    for key in ("double_blocks.0.img_attn.norm.key_norm.scale",
                "distilled_guidance_layer.norms.0.scale", "distilled_guidance_layer.in_proj.bias",
                "double_blocks.1.txt_attn.qkv.weight", "single_blocks.1.linear1.weight",
                "final_layer.linear.weight", "img_in.weight", "txt_in.weight"):
        assert key in written, key
    assert not any(k.endswith(("img_mod.lin.weight", "modulation.lin.weight")) or
                   k.startswith(("vector_in", "guidance_in", "time_in")) for k in written)
    given = dict(written)
    converted = convert_chroma_transformer_checkpoint_to_diffusers(given)
    assert given == {}  # the reader used every tensor
    expected = transformer.state_dict()
    assert converted.keys() == expected.keys()
    assert all(converted[k].shape == expected[k].shape for k in expected)


def test_flux1_detection_does_not_claim_a_chroma_file(model, tmp_path):
    from trainer.families.chroma.checkpoint import save_checkpoint
    from trainer.families.common.files import read_safetensors_header
    from trainer.families.common.mmdit_detect import detect_flow, detect_flow_file
    from trainer.families.flux import detect as flux_detect
    from trainer.families.spec import DetectionError

    path = save_checkpoint(tmp_path / "Chroma1-HD.safetensors", {"transformer": model.denoiser})
    found = detect_path(path)
    assert (found.family, found.header.variant) == ("chroma", "hd")
    assert found.header.transformer_config["approximator_layers"] == 2
    tensors = read_safetensors_header(path).tensors
    with pytest.raises(DetectionError, match="it is Chroma"):  # FLUX.1's reader
        detect_flow(tensors.keys(), lambda k: tuple(tensors[k]["shape"]),
                    lambda k: tensors[k]["dtype"])
    with pytest.raises(DetectionError, match="it is Chroma"):
        flux_detect.from_header(tensors)
    assert detect_flow_file(path).version == "chroma"  # the advisor's reader: Chroma's facts


def _part_files(model, folder):
    from safetensors.torch import save_file

    from trainer.families.common.mmdit_checkpoint import t5_tensors, vae_tensors

    ae, t5 = folder / "ae.safetensors", folder / "t5xxl_fp16.safetensors"
    save_file({k: v.contiguous() for k, v in vae_tensors(model.vae).items()}, str(ae))
    save_file({k: v.contiguous() for k, v in t5_tensors(model.text_encoder).items()}, str(t5))
    return ae, t5


def test_a_transformer_only_file_loads_with_its_ae_and_t5_files(model, tmp_path):
    from trainer.families.chroma.checkpoint import save_checkpoint
    from trainer.families.spec import ModelLoadError

    base = resolve_model_path("embedded:tiny-chroma")
    path = save_checkpoint(tmp_path / "Chroma1-HD.safetensors", {"transformer": model.denoiser})
    ae, t5 = _part_files(model, tmp_path)
    with pytest.raises(ModelLoadError, match="model.ae .*model.t5xxl"):
        load_base_model(ModelSection(pretrained_model_name_or_path=str(path),
                                     config_dir=str(base), tokenizer=str(base)))
    loaded = load_base_model(ModelSection(
        pretrained_model_name_or_path=str(path), ae=str(ae), t5xxl=str(t5),
        config_dir=str(base), tokenizer=str(base)), dtype=torch.bfloat16)
    assert loaded.version == "chroma" and loaded.denoiser.dtype == torch.bfloat16
    for ours, theirs in ((loaded.denoiser, model.denoiser), (loaded.vae, model.vae),
                         (loaded.text_encoder, model.text_encoder)):
        got, want = ours.state_dict(), theirs.state_dict()
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in want)


def test_an_fp8_file_streams_into_fp8_storage(model, tmp_path):
    from trainer.families.chroma.checkpoint import save_checkpoint

    base = resolve_model_path("embedded:tiny-chroma")
    path = save_checkpoint(tmp_path / "chroma_fp8.safetensors", {"transformer": model.denoiser},
                           dtype=torch.float8_e4m3fn)
    ae, t5 = _part_files(model, tmp_path)
    loaded = load_base_model(ModelSection(
        pretrained_model_name_or_path=str(path), ae=str(ae), t5xxl=str(t5),
        config_dir=str(base), tokenizer=str(base), base_precision="fp8"), dtype=torch.bfloat16)
    weight = loaded.denoiser.transformer_blocks[0].attn.to_q.weight
    assert weight.dtype == torch.float8_e4m3fn
    want = model.denoiser.transformer_blocks[0].attn.to_q.weight.to(torch.float8_e4m3fn)
    assert torch.equal(weight.view(torch.uint8), want.view(torch.uint8))


def test_a_comfyui_scaled_fp8_file_loads_as_its_dequantized_weights(model, tmp_path):
    """ComfyUI's legacy scaled fp8 form (``scaled_fp8`` marker, ``<layer>.scale_weight``): each
    block Linear is read as ``fp8 * scale`` (trainer/families/common/comfy_quant.py)."""
    from safetensors.torch import save_file

    from trainer.families.chroma.checkpoint import chroma_tensors

    base = resolve_model_path("embedded:tiny-chroma")
    tensors, expected = {}, {}
    for key, value in chroma_tensors(model.denoiser).items():
        value = value.float().contiguous()
        if key.startswith(("double_blocks.", "single_blocks.")) and value.ndim == 2:
            scale = value.abs().max() / 448
            tensors[key] = (value / scale).to(torch.float8_e4m3fn)
            tensors[key[:-len("weight")] + "scale_weight"] = scale.reshape(())
            expected[key] = tensors[key].float() * scale
        else:
            tensors[key] = value
    tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    path = tmp_path / "Chroma1-HD_fp8_scaled.safetensors"
    save_file(tensors, str(path))
    ae, t5 = _part_files(model, tmp_path)
    loaded = load_base_model(ModelSection(
        pretrained_model_name_or_path=str(path), ae=str(ae), t5xxl=str(t5),
        config_dir=str(base), tokenizer=str(base)))
    block = loaded.denoiser.single_transformer_blocks[0]
    linear1 = torch.cat([block.attn.to_q.weight, block.attn.to_k.weight, block.attn.to_v.weight,
                         block.proj_mlp.weight])
    torch.testing.assert_close(linear1, expected["single_blocks.0.linear1.weight"])
    proj = loaded.denoiser.transformer_blocks[0].attn.to_out[0].weight
    torch.testing.assert_close(proj, expected["double_blocks.0.img_attn.proj.weight"])


@pytest.mark.parametrize("setting, named", [
    ({"flow": {"guidance_scale": 3.5}}, "flow.guidance_scale"),
    ({"training": {"mixed_precision": "fp16"}}, "fp16"),
    ({"model": {"clip_l": "/m/clip_l.safetensors"}}, "model.clip_l"),
])
def test_what_chroma_cannot_ask_is_refused_naming_the_setting(setting, named):
    from trainer.config.files import ConfigError, from_dict

    raw = {"model": {"pretrained_model_name_or_path": "embedded:tiny-chroma"}}
    for section, values in setting.items():
        raw.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=named):
        from_dict(raw)


def test_the_advisors_flow_law_of_chroma_equals_its_small_models(monkeypatch, tmp_path):
    """The advisor simulates Chroma's small models (no pooled text input) and its law of the
    size equals the whole simulation (trainer/families/chroma/memory.py)."""
    from trainer.advisor import flow_memory as fm
    from trainer.advisor import shipped
    from trainer.advisor.make_shipped import flow_config
    from trainer.config.files import from_dict

    monkeypatch.setenv("KOHYA_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(shipped._LOADED, "index", {})
    config = flow_config("embedded:tiny-chroma")
    cfg = from_dict({"network": {"network_dim": 4}})
    for blocks in fm._shapes(config):
        got = fm.flow_law(config, blocks, cfg, True, 2)
        assert got is not None and got.inexact == 0
        whole = fm._simulate(fm._small_model(config, blocks, cfg), config, (96, 64), 2, True)
        assert got.peak((2, 4, 6, 4, 1)) == whole
