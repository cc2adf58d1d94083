"""FLUX.1 Kontext trains in the one loop on edit pairs (two targets, each with a reference, built
here): its LoRA file loads in diffusers' ``FluxKontextPipeline.load_lora_weights`` and gives
the trained output on a fixed reference (1e-5); its names are FLUX.1's kohya form, every one of
which ComfyUI maps (``comfy/lora.py`` ``model_lora_keys_unet``: ``lora_unet_`` + the path of
each ``diffusion_model.`` weight of BFL's layout, with underscores; ``model_lora_keys_clip``:
CLIP-L ``lora_te1_``, T5 ``lora_te3_``: the ports of tests/test_lycoris_flow.py). DreamBooth
writes the single file in BFL's layout and the Kontext folder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from control_helpers import pairs, watch_edit_run
from diffusers import FluxKontextPipeline, FluxTransformer2DModel
from flow_helpers import scale_diffusers_flux_split
from safetensors import safe_open
from safetensors.torch import load_file
from test_flow_train import single_file_model
from test_lycoris_flow import comfy_clip_map, comfy_t5_map
from train_helpers import small_config

from trainer.events import ListSink, Log
from trainer.families import family
from trainer.families.common.mmdit_checkpoint import flux_tensors
from trainer.models.loader import resolve_model_path
from trainer.models.text_conditioning import TextConditioning
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
MODEL = "embedded:tiny-flux-kontext"


def kontext_config(tmp_path, mode: str = "lora", **sections):
    train = pairs(tmp_path / "data", names=("a", "b"), sizes=((64, 64), (64, 80)))
    dataset = {"control_dir": "control", "bucket_reso_steps": 16,
               **sections.pop("dataset", {})}
    model = {"pretrained_model_name_or_path": MODEL, **sections.pop("model", {})}
    return small_config(tmp_path, train, mode, model=model, dataset=dataset, **sections)


def fixed_inputs(transformer):
    """A noisy target, sigmas, text and a reference of another size than the target's."""
    gen = torch.Generator().manual_seed(7)
    c = transformer.config
    channels = c.in_channels // 4
    text = TextConditioning(torch.randn(2, 12, c.joint_attention_dim, generator=gen),
                            torch.randn(2, c.pooled_projection_dim, generator=gen))
    return (torch.randn(2, channels, 8, 8, generator=gen), torch.tensor([0.3, 0.8]), text,
            torch.randn(2, channels, 10, 6, generator=gen))


def predict(transformer, cfg) -> torch.Tensor:
    noisy, sigmas, text, reference = fixed_inputs(transformer)
    model = SimpleNamespace(denoiser=transformer, version="flux1_kontext")
    with torch.no_grad():
        return family("flux1_kontext", guidance=cfg.flow.guidance_scale).predict(
            model, noisy, sigmas, text, None, cfg, controls=[reference])


def comfyui_names(pipe) -> dict[str, tuple[int, ...]]:
    """ComfyUI's kohya names of FLUX.1 over the BFL layout of ``pipe``'s model: name -> the
    weight's shape (``lora_te1_`` CLIP-L, ``lora_te3_`` T5)."""
    names = {"lora_unet_" + k[:-len(".weight")].replace(".", "_"): tuple(v.shape)
             for k, v in flux_tensors(pipe.transformer).items() if k.endswith(".weight")}
    clip = {k.removeprefix("text_model."): v for k, v in pipe.text_encoder.state_dict().items()}
    for name, (_, path) in comfy_clip_map(pipe.text_encoder.config.num_hidden_layers).items():
        names[name] = tuple(clip[f"{path}.weight"].shape)
    t5 = pipe.text_encoder_2.state_dict()
    for name, (_, path) in comfy_t5_map(t5).items():
        names[name] = tuple(t5[f"{path}.weight"].shape)
    return names


def test_a_kontext_lora_trains_on_pairs_and_diffusers_reproduces_it(tmp_path, monkeypatch):
    # diffusers' FLUX.1 reader asserts FLUX.1's real widths on a fused linear1 (before any
    # split): the double blocks train, as tests/test_flow_train.py's FLUX.1 round trip
    cfg = kontext_config(tmp_path, network={"train_text_encoder": True, "network_alpha": 2.0,
                                            "network_dim": 4, "train_blocks": "double"},
                         optimizer={"learning_rate": 1e-2}, training={"max_train_steps": 4})
    trained, steps = watch_edit_run(monkeypatch, type(family("flux1_kontext")),
                                    lambda model: predict(model.unet, cfg))
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    # every step read its reference, sized as the pipeline sizes it: a square one 1024 x 1024,
    # the 64 x 80 one 944 x 1104 (PREFERRED_KONTEXT_RESOLUTIONS' nearest aspect), / 8
    assert len(steps) == 4
    assert {s for shapes in steps for s in shapes} == {(1, 16, 128, 128), (1, 16, 138, 118)}
    pipe = FluxKontextPipeline.from_pretrained(resolve_model_path(MODEL), local_files_only=True)
    before = predict(pipe.transformer, cfg)
    names = comfyui_names(pipe)
    pipe.load_lora_weights(result.output_path)
    after = predict(pipe.transformer, cfg)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, trained["out"], atol=1e-5, rtol=1e-5)
    tensors = load_file(result.output_path)
    modules = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
               for k in tensors}
    assert modules - names.keys() == set()  # ComfyUI: no "lora key not loaded"
    for name in modules:
        up, down = tensors[f"{name}.lora_up.weight"], tensors[f"{name}.lora_down.weight"]
        assert (up.shape[0], down.shape[1]) == names[name], name
    assert "lora_unet_double_blocks_0_img_attn_qkv" in modules
    assert any(m.startswith("lora_te1_") for m in modules)
    with safe_open(result.output_path, "pt") as f:
        meta = f.metadata()
    assert meta["ss_base_model_version"] == "flux1"
    assert meta["ss_network_module"] == "networks.lora_flux"
    assert meta["modelspec.architecture"] == "flux-1-kontext-dev/lora"


def test_dreambooth_writes_the_bfl_single_file_and_a_kontext_folder(tmp_path, monkeypatch):
    cfg = kontext_config(tmp_path, "dreambooth", training={"max_train_steps": 2},
                         optimizer={"learning_rate": 1e-3})
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    folder = result.output_path.removesuffix(".safetensors")
    pipe = FluxKontextPipeline.from_pretrained(folder, local_files_only=True)
    base = FluxKontextPipeline.from_pretrained(resolve_model_path(MODEL), local_files_only=True)
    trained = predict(pipe.transformer, cfg)
    assert (trained - predict(base.transformer, cfg)).abs().max() > 1e-4
    scale_diffusers_flux_split(monkeypatch)
    single = FluxTransformer2DModel.from_single_file(
        result.output_path, subfolder="transformer", config=str(resolve_model_path(MODEL)),
        local_files_only=True)
    torch.testing.assert_close(predict(single, cfg), trained, atol=1e-5, rtol=1e-5)
    with safe_open(result.output_path, "pt") as f:
        assert "double_blocks.0.img_attn.qkv.weight" in f.keys()


def test_a_bfl_single_file_trains_as_kontext_when_model_version_says_so(tmp_path):
    """A Kontext file has FLUX.1-dev's keys (the tiny twins share their weights): read as
    FLUX.1, its controls are refused naming the setting; with model.model_version =
    'flux1_kontext' it trains on the pairs from the file and its part files."""
    model = single_file_model(tmp_path, "flux1")
    cfg = kontext_config(tmp_path, model=model, training={"max_train_steps": 2})
    result = run(cfg, ListSink())
    assert result.status == "failed" and result.step == 0
    assert "dataset.control_dir is set but FLUX.1 is not an edit model" in result.error
    assert "FLUX.1 Kontext (model.model_version = 'flux1_kontext')" in result.error
    cfg = kontext_config(tmp_path / "again", model={**model, "model_version": "flux1_kontext"},
                         training={"max_train_steps": 2})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert any("FLUX.1 Kontext, by model.model_version (FLUX.1-dev" in log.message
               for log in sink.of(Log))
    with safe_open(result.output_path, "pt") as f:
        assert f.metadata()["modelspec.architecture"] == "flux-1-kontext-dev/lora"


def test_kontext_refuses_a_schnell_file(tmp_path):
    from safetensors.torch import save_file

    from trainer.config import ModelSection
    from trainer.families.common.tiny_mmdit import build_flux_components
    from trainer.families.spec import ModelLoadError
    from trainer.models.loader import load_base_model

    schnell = build_flux_components(guidance_embeds=False)["transformer"]
    path = tmp_path / "flux1-schnell.safetensors"
    save_file({k: v.contiguous() for k, v in flux_tensors(schnell).items()}, str(path))
    with pytest.raises(ModelLoadError, match="model.model_version = 'flux1_kontext', but the "
                                             "file is FLUX.1-schnell"):
        load_base_model(ModelSection(pretrained_model_name_or_path=str(path),
                                     model_version="flux1_kontext"))


def test_the_tiny_kontext_preset_trains_on_the_sample_pairs_and_samples_with_a_reference(
        tmp_path, monkeypatch):
    """presets/lora/tiny-flux-kontext.toml: the embedded sample dataset's controls are found
    (each step reads a reference), and a sample prompt's ``--ci`` reference reaches the
    pipeline (the same prompt and seed without it gives another image)."""
    from PIL import Image

    from trainer.config.files import from_dict, load, to_dict
    from trainer.config.paths import PROJECT_ROOT, data_home
    from trainer.data.sample import SAMPLE_CONTROLS, sample_control_files
    from trainer.events import Sample

    control = data_home() / "embedded" / SAMPLE_CONTROLS / sorted(sample_control_files())[0]
    prompt = "a red circle, blue background --d 3 --s 2"
    raw = to_dict(load(PROJECT_ROOT / "presets" / "lora" / "tiny-flux-kontext.toml",
                       [f"saving.output_dir={tmp_path}", "training.log_with=none",
                        "training.max_train_steps=2", "sampling.sample_every_n_steps=2"]))
    raw["sampling"]["sample_prompts"] = [f"{prompt} --ci {control}", prompt]
    steps = []
    real_predict = type(family("flux1_kontext")).predict

    def seen(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        if model.denoiser.training:
            steps.append(len(controls or []))
        return real_predict(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    monkeypatch.setattr(type(family("flux1_kontext")), "predict", seen)
    sink = ListSink()
    result = run(from_dict(raw), sink)
    assert result.status == "finished", result.error
    assert steps == [1, 1]
    [sample] = sink.of(Sample)
    assert sample.controls == ((str(control),), ())  # the GUI draws the first beside it
    with_ref, without = (Image.open(p).convert("RGB") for p in sample.paths)
    assert with_ref.tobytes() != without.tobytes()
    # at the size asked (the preset's resolution; --w / --h), not FluxKontextPipeline's
    # default area of 1024 x 1024
    assert with_ref.size == without.size == (raw["dataset"]["resolution"],) * 2
