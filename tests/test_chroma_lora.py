"""Chroma LoRA files (trainer/families/chroma/lora.py, targets.py): sd-scripts' kohya names on
Black Forest Labs' layout, which ComfyUI maps with no key left over and diffusers'
``ChromaPipeline.load_lora_weights`` reads back to the trained output; the tools read the
peers' forms (sd-scripts' ``lora_te3_`` T5, ai-toolkit's ``diffusion_model.*.lora_A``).

The expected names are derived from the original layout (the BFL keys of the tiny twin, the
layout diffusers' reader consumes: tests/test_chroma_family.py) by sd-scripts' rule (every
Linear of a double or single block, ``lora_unet_`` + the path with underscores) and ComfyUI's
(``comfy/lora.py``: ``lora_unet_`` + each ``diffusion_model.`` weight's path; the text
encoders it holds numbered from 1, so Chroma's T5, ``t5xxl.transformer.*``, is ``lora_te1_``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from trainer.config import ModelSection
from trainer.families import family
from trainer.families.chroma.checkpoint import chroma_tensors
from trainer.families.chroma.lora import T5_TARGETS, run_state_dict, target_modules
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
RANK, ALPHA = 4, 2.0
SUFFIXES = ("lora_down.weight", "lora_up.weight", "alpha")


def fresh():
    return load_base_model(ModelSection(pretrained_model_name_or_path="embedded:tiny-chroma"))


def randomize(*modules):
    gen = torch.Generator().manual_seed(3)
    for module in modules:
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.data = torch.randn(p.shape, generator=gen) * 0.1


def adapted(model, targets=None, t5=False):
    model.denoiser.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets or
                                          target_modules(model.denoiser)))
    if t5:
        inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=T5_TARGETS),
                                model.text_encoder)
    randomize(model.denoiser, model.text_encoder)
    return model


def modules_of(tensors):
    names = {k.split(".", 1)[0] for k in tensors}
    assert {k.split(".", 1)[1] for k in tensors} == set(SUFFIXES)
    return names


def comfyui_names(model, bfl) -> dict[str, tuple[int, ...]]:
    """ComfyUI's LoRA key map of Chroma (``model_lora_keys_unet`` / ``_clip``) over the
    original layout ``bfl``: name -> the weight's shape."""
    names = {"lora_unet_" + k[:-len(".weight")].replace(".", "_"): tuple(v.shape)
             for k, v in bfl.items() if k.endswith(".weight")}
    for k, v in model.text_encoder.state_dict().items():
        if k.endswith(".weight"):  # t5xxl.transformer.<k>: lora_te1_ (its first encoder)
            names["lora_te1_" + k[:-len(".weight")].replace(".", "_")] = tuple(v.shape)
    return names


def test_the_file_names_every_block_linear_as_sd_scripts_and_comfyui_loads_all():
    model = fresh()
    bfl = chroma_tensors(model.denoiser)
    comfy = comfyui_names(model, bfl)
    adapted(model, t5=True)
    tensors = run_state_dict(model.denoiser, {"text_encoder": model.text_encoder}, torch.float32)
    sd_scripts = {"lora_unet_" + k[:-len(".weight")].replace(".", "_") for k, v in bfl.items()
                  if k.startswith(("double_blocks.", "single_blocks.")) and v.ndim == 2}
    names = modules_of(tensors)
    assert {n for n in names if n.startswith("lora_unet_")} == sd_scripts
    assert any(n.startswith("lora_te1_encoder_block_0_layer_0_SelfAttention_q") for n in names)
    assert names - comfy.keys() == set()  # no "lora key not loaded"
    for name in names:  # the update fits the weight it is added to
        rows, cols = comfy[name]
        assert tensors[f"{name}.lora_up.weight"].shape[0] == rows
        assert tensors[f"{name}.lora_down.weight"].shape[1] == cols


def test_the_fused_linear1_is_the_sum_of_its_parts_updates():
    model = adapted(fresh())
    tensors = run_state_dict(model.denoiser, {}, torch.float32)
    key = "lora_unet_single_blocks_0_linear1"
    up, down = tensors[f"{key}.lora_up.weight"], tensors[f"{key}.lora_down.weight"]
    fused = up @ down * tensors[f"{key}.alpha"] / down.shape[0]
    block = model.denoiser.single_transformer_blocks[0]
    parts = [block.attn.to_q, block.attn.to_k, block.attn.to_v, block.proj_mlp]
    torch.testing.assert_close(fused, torch.cat([p.get_delta_weight("default") for p in parts]))


def test_diffusers_load_lora_weights_reproduces_the_trained_output():
    """Without linear1: diffusers' kohya FLUX converter splits it with FLUX.1's widths
    (``dims=[3072, 3072, 3072, 12288]``, asserted), which the tiny twin does not have."""
    model = fresh()
    base = copy.deepcopy(model.denoiser)
    targets = [t for t in target_modules(model.denoiser)
               if not (t.startswith("single_") and (".attn." in t or "proj_mlp" in t))]
    adapted(model, targets)
    fam = family("chroma")
    with torch.no_grad():
        text = fam.encode(model, ["a red circle"], 1)
    noisy = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.4])
    with torch.no_grad():
        trained = fam.predict(model, noisy, t, text, None)
        untrained = fam.predict(model, noisy, t, text, None, denoiser=base)
    pipe = fam.pipeline(model, base, model.noise_scheduler)
    pipe.load_lora_weights(run_state_dict(model.denoiser, {}, torch.float32))
    with torch.no_grad():
        loaded = fam.predict(model, noisy, t, text, None, denoiser=pipe.transformer)
    assert (trained - untrained).abs().max() > 1e-3
    torch.testing.assert_close(loaded, trained, atol=1e-5, rtol=1e-5)


def test_the_tools_read_sd_scripts_and_ai_toolkit_chroma_loras(tmp_path):
    """sd-scripts' file (its T5 as ``lora_te3_``) and ai-toolkit's (``diffusion_model.`` +
    BFL path + ``lora_A`` / ``lora_B``, no alpha) merge into every layer they name."""
    from safetensors.torch import save_file

    from trainer.families.common.mmdit_lora_file import FlowLoraInfo, flow_lora_metadata
    from trainer.tools.merge import merge
    from trainer.tools.options import MergeOptions

    model = adapted(fresh(), t5=True)
    tensors = run_state_dict(model.denoiser, {"text_encoder": model.text_encoder}, torch.float32)
    sd_scripts = {k.replace("lora_te1_", "lora_te3_"): v for k, v in tensors.items()}
    ai_toolkit = {}
    for key, value in tensors.items():
        name, suffix = key.split(".", 1)
        if name.startswith("lora_unet_") and suffix != "alpha":
            path = name[len("lora_unet_"):]
            path = path.replace("double_blocks_0_", "double_blocks.0.").replace(
                "single_blocks_0_", "single_blocks.0.")
            path = path.replace("_attn_", "_attn.").replace("_mlp_", "_mlp.")
            scale = tensors[f"{name}.alpha"] / RANK if suffix == "lora_up.weight" else 1
            ai_toolkit[f"diffusion_model.{path}.{'lora_B' if 'up' in suffix else 'lora_A'}"
                       f".weight"] = value * scale
    meta = flow_lora_metadata(FlowLoraInfo("chroma", "hd"))
    base = resolve_model_path("embedded:tiny-chroma")
    for name, lora in (("sd_scripts", sd_scripts), ("ai_toolkit", ai_toolkit)):
        path = tmp_path / f"{name}.safetensors"
        save_file(lora, str(path), metadata=meta)
        merged = merge(MergeOptions(base=str(base), loras=[str(path)],
                                    save_folder=str(tmp_path / name), precision="fp32"))
        assert merged.family == "chroma"
        assert merged.loras[0].unmatched == [], name
        modules = {k.rsplit(".", 2)[0] if k.startswith("diffusion_model.") else k.split(".")[0]
                   for k in lora}
        assert merged.loras[0].applied == len(modules), name


def test_resize_and_extract_write_chroma_loras_in_its_form(tmp_path):
    """resize keeps the file's kohya names (the fused layers' pieces reduced each), extract
    from a merged model names every changed layer as the family's LoRA does."""
    from safetensors.torch import load_file

    from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora
    from trainer.tools.extract import extract
    from trainer.tools.inspect import inspect
    from trainer.tools.merge import merge
    from trainer.tools.options import ExtractOptions, InspectOptions, MergeOptions, ResizeOptions
    from trainer.tools.resize import resize

    model = adapted(fresh())
    lora = save_flow_lora(tmp_path / "lora.safetensors",
                          run_state_dict(model.denoiser, {}, torch.float32),
                          FlowLoraInfo("chroma", "hd"))
    names = modules_of(load_file(str(lora)))
    resize(ResizeOptions(path=str(lora), save_to=str(tmp_path / "r.safetensors"), rank=2))
    assert modules_of(load_file(str(tmp_path / "r.safetensors"))) == names
    base = resolve_model_path("embedded:tiny-chroma")
    merge(MergeOptions(base=str(base), loras=[str(lora)], save_folder=str(tmp_path / "tuned"),
                       precision="fp32"))
    extract(ExtractOptions(base=str(base), tuned=str(tmp_path / "tuned"), rank=RANK * 4,
                           save_to=str(tmp_path / "x.safetensors"), precision="fp32"))
    assert modules_of(load_file(str(tmp_path / "x.safetensors"))) == names
    for path in ("r.safetensors", "x.safetensors"):
        assert inspect(InspectOptions(path=str(tmp_path / path))).family == "chroma"
