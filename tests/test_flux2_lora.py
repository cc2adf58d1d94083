"""FLUX.2's LoRA file as the ecosystem reads it, on the tiny klein twin and the tiny dev twin
(``Flux2Pipeline``, a guidance embedder, whose LoRA has klein's form).

- **ComfyUI**: every module name is ``lora_unet_`` + a weight path of BFL's layout (the model
  ComfyUI builds, ``comfy/lora.py`` ``model_lora_keys_unet``) with dots as underscores; the
  BFL names are the ones diffusers' ``convert_flux2_transformer_checkpoint_to_diffusers`` reads
  into the transformer exactly (the original layout's reader, not our writer); each module's
  ``up @ down * alpha / rank`` (ComfyUI's ``weight_adapter/lora.py``) has that weight's shape
  and equals the trained layers' update, the fused q/k/v rows in BFL's order.
- **diffusers**: ``Flux2KleinPipeline.load_lora_weights`` (dev: ``Flux2Pipeline``'s) on the
  file gives the trained transformer's output (1e-5).
"""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.config import ModelSection
from trainer.families import family
from trainer.families.flux2.checkpoint import bfl_tensors
from trainer.families.flux2.lora import kohya_tensors, target_modules
from trainer.models.loader import load_base_model

pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def klein():
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-flux2"))


@pytest.fixture(scope="module", params=["klein", "dev"])
def model(request, klein):
    if request.param == "klein":
        return klein
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-flux2-dev"))


def adapted(model, train_blocks="all", rank=4, alpha=2.0):
    """A copy of the tiny transformer with a LoRA whose up weights are random (as trained)."""
    from peft import LoraConfig, inject_adapter_in_model

    transformer = copy.deepcopy(model.denoiser)
    config = LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                        target_modules=target_modules(transformer, train_blocks))
    inject_adapter_in_model(config, transformer)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return transformer


def bfl_weights(model) -> dict[str, tuple[int, ...]]:
    """BFL's weight names and shapes of the tiny transformer, checked against diffusers' own
    reader of the original layout."""
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers as convert,
    )

    bfl = bfl_tensors(model.denoiser)
    back = convert(dict(bfl))
    ours = model.denoiser.state_dict()
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)
    return {k: tuple(v.shape) for k, v in bfl.items()}


def test_the_file_names_bfl_weights_as_comfyui_maps_them(model):
    weights = bfl_weights(model)
    comfy = {"lora_unet_" + k[:-len(".weight")].replace(".", "_"): k
             for k in weights if k.endswith(".weight")}
    transformer = adapted(model)
    tensors = kohya_tensors(transformer, torch.float32)
    modules = {k.split(".")[0] for k in tensors}  # kohya names hold no dots
    assert {"lora_unet_double_blocks_0_img_attn_qkv", "lora_unet_double_blocks_1_txt_mlp_2",
            "lora_unet_single_blocks_0_linear1", "lora_unet_single_blocks_1_linear2"} <= modules
    left = sorted(m for m in modules if m not in comfy)
    assert left == []  # ComfyUI's "lora key not loaded"
    for name in modules:
        up, down = tensors[f"{name}.lora_up.weight"], tensors[f"{name}.lora_down.weight"]
        alpha = float(tensors[f"{name}.alpha"])
        delta = up @ down * alpha / down.shape[0]
        assert tuple(delta.shape) == weights[comfy[name]], name
    # the update of the fused qkv is the parts' updates, stacked in BFL's row order
    attn = transformer.transformer_blocks[0].attn
    parts = [attn.to_q, attn.to_k, attn.to_v]
    want = torch.cat([p.get_delta_weight("default") for p in parts], dim=0)
    name = "lora_unet_double_blocks_0_img_attn_qkv"
    got = tensors[f"{name}.lora_up.weight"] @ tensors[f"{name}.lora_down.weight"]
    torch.testing.assert_close(got * float(tensors[f"{name}.alpha"]) / 12, want)
    # the modulations and embedders, outside the blocks, do not train
    assert not any("modulation" in m or "_in" == m[-3:] for m in modules)


def test_train_blocks_picks_the_single_or_double_blocks(model):
    singles = target_modules(model.denoiser, "single")
    assert singles and all(m.startswith("single_transformer_blocks.") for m in singles)
    doubles = target_modules(model.denoiser, "double")
    assert doubles and all(m.startswith("transformer_blocks.") for m in doubles)
    assert sorted(singles + doubles) == target_modules(model.denoiser, "all")


def test_diffusers_load_lora_weights_gives_the_trained_output(model, tmp_path):
    from safetensors.torch import save_file

    transformer = adapted(model)
    path = tmp_path / "lora.safetensors"
    save_file(kohya_tensors(transformer, torch.float32), str(path))
    pipe = family("flux2").pipeline(model, model.denoiser, model.noise_scheduler)
    torch.manual_seed(0)
    noisy, t = torch.randn(2, 8, 8, 8), torch.tensor([0.7, 0.3])
    text = family("flux2").encode(model, ["a red circle", "a shape"], clip_skip=1)
    with torch.no_grad():
        base = family("flux2").predict(model, noisy, t, text, None, denoiser=model.denoiser)
        want = family("flux2").predict(model, noisy, t, text, None, denoiser=transformer)
        pipe.load_lora_weights(str(path))
        got = family("flux2").predict(model, noisy, t, text, None, denoiser=pipe.transformer)
        pipe.unload_lora_weights()
    assert (want - base).abs().max() > 1e-3  # the LoRA changes the output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_extracted_lora_is_a_flux2_file_of_bfl_names(klein, tmp_path):
    """``tools extract`` of a tuned FLUX.2 (its BFL single file) against the twin's folder:
    the file is told FLUX.2 by its metadata and names BFL weights only."""
    from trainer.families.flux2.checkpoint import save_checkpoint
    from trainer.models.loader import resolve_model_path
    from trainer.tools.extract import extract
    from trainer.tools.inspect import inspect
    from trainer.tools.options import ExtractOptions, InspectOptions

    model = klein
    tuned = copy.deepcopy(model.denoiser)
    torch.manual_seed(2)
    with torch.no_grad():
        for m in (tuned.single_transformer_blocks[0].attn.to_out,
                  tuned.transformer_blocks[1].ff.linear_in):
            m.weight.add_(torch.randn_like(m.weight) * 0.1)
    folder = resolve_model_path("embedded:tiny-flux2")
    single = tmp_path / "tuned.safetensors"
    save_checkpoint(single, {"transformer": tuned, "vae": model.vae,
                             "text_encoder": model.text_encoder},
                    parts=("transformer", "vae", "qwen3"), dtype=torch.float32)
    out = tmp_path / "extracted.safetensors"
    extract(ExtractOptions(base=str(folder), tuned=str(single), save_to=str(out), rank=4,
                           precision="fp32", config_dir=str(folder)))
    report = inspect(InspectOptions(path=str(out)))
    assert report.family == "flux2", report.family_reason
    comfy = {"lora_unet_" + k[:-len(".weight")].replace(".", "_")
             for k in bfl_weights(model) if k.endswith(".weight")}
    assert {m.name for m in report.modules} == {"lora_unet_single_blocks_0_linear2",
                                   "lora_unet_double_blocks_1_img_mlp_0"} <= comfy
