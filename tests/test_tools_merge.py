"""Merging LoRAs into a base model, held to diffusers' LoRA loader as the reference.

The reference is the tiny base pipeline with the same LoRA file(s) loaded by diffusers'
``load_lora_weights`` at the same scale(s) (``set_adapters``); the merged checkpoint is read back
by diffusers' own single-file reader. Tolerance: 1e-4 absolute on the UNet's and the text
encoder's outputs (values of order 1) in fp32 - the merged weights and the adapter's two extra
matmuls round differently, nothing more. The LoRAs have alpha != rank and 3x3 conv modules.
"""

from __future__ import annotations

import pytest
import torch
from tools_helpers import TE_TARGETS, UNET_TARGETS, random_lora, randomize

from trainer.tools.common import ToolError
from trainer.tools.lora_file import read_lora
from trainer.tools.merge import merge
from trainer.tools.options import MergeOptions, OptionsError, validate

ATOL = 1e-4


def fixed_inputs(tokenizer):
    gen = torch.Generator().manual_seed(0)
    ids = tokenizer(["a photo of a red cat"], padding="max_length", max_length=77,
                    return_tensors="pt").input_ids
    return torch.randn(1, 4, 16, 16, generator=gen), torch.randn(1, 77, 32, generator=gen), ids


@torch.no_grad()
def outputs(pipe, inputs):
    sample, hidden, ids = inputs
    return pipe.unet(sample, 10, hidden).sample, pipe.text_encoder(ids)[0]


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return (random_lora(root / "a.safetensors", seed=1),
            random_lora(root / "b.safetensors", seed=7, rank=2, alpha=3.0, conv=False))


def diffusers_with(model_dir, files_and_scales):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True)
    names = []
    for i, (path, _) in enumerate(files_and_scales):
        pipe.load_lora_weights(str(path), adapter_name=f"l{i}")
        names.append(f"l{i}")
    pipe.set_adapters(names, [scale for _, scale in files_and_scales])
    return pipe


def merged_pipeline(path, model_dir):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_single_file(str(path), config=str(model_dir),
                                                    local_files_only=True)


def assert_same_outputs(got, want, base):
    for g, w, b in zip(got, want, base):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
        assert (w - b).abs().max() > 0.05  # the LoRA changes the output


def test_one_lora_equals_diffusers_loading_it(loras, tiny_model_dir, tmp_path):
    from diffusers import StableDiffusionPipeline

    out = tmp_path / "merged.safetensors"
    report = merge(MergeOptions(base=str(tiny_model_dir), loras=[str(loras[0])],
                                weights=[0.7], save_to=str(out), precision="fp32"))
    assert report.outputs == [str(out)] and report.loras[0].unmatched == []
    pipe = merged_pipeline(out, tiny_model_dir)
    inputs = fixed_inputs(pipe.tokenizer)
    base = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    want = outputs(diffusers_with(tiny_model_dir, [(loras[0], 0.7)]), inputs)
    assert_same_outputs(outputs(pipe, inputs), want, outputs(base, inputs))


def test_two_loras_equal_loading_both(loras, tiny_model_dir, tmp_path):
    from diffusers import StableDiffusionPipeline

    out, folder = tmp_path / "merged.safetensors", tmp_path / "merged"
    report = merge(MergeOptions(base=str(tiny_model_dir), loras=[str(p) for p in loras],
                                weights=[0.8, -0.5], save_to=str(out), save_folder=str(folder),
                                precision="fp32"))
    assert [m.applied for m in report.loras] == [len(read_lora(p).modules) for p in loras]
    inputs = fixed_inputs(merged_pipeline(out, tiny_model_dir).tokenizer)
    want = outputs(diffusers_with(tiny_model_dir, [(loras[0], 0.8), (loras[1], -0.5)]), inputs)
    base = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    from_folder = StableDiffusionPipeline.from_pretrained(folder, local_files_only=True)
    for pipe in (merged_pipeline(out, tiny_model_dir), from_folder):
        assert_same_outputs(outputs(pipe, inputs), want, outputs(base, inputs))


def test_metadata_names_the_sources(loras, tiny_model_dir, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "mix.safetensors"
    merge(MergeOptions(base=str(tiny_model_dir), loras=[str(loras[1])], save_to=str(out)))
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
        dtype = f.get_tensor(next(iter(f.keys()))).dtype
    assert meta["modelspec.architecture"] == "stable-diffusion-v1"
    assert meta["modelspec.title"] == "mix"
    assert meta["modelspec.merged_from"] == f"{tiny_model_dir.name}, last (1)"
    assert dtype == torch.float16  # the default precision


def test_a_single_file_base_merges_too(loras, tiny_model_dir, tmp_path):
    """Merged from the first merge's single file: the LoRA lands twice."""
    first, second = tmp_path / "once.safetensors", tmp_path / "twice.safetensors"
    opts = dict(loras=[str(loras[1])], weights=[0.5], precision="fp32")
    merge(MergeOptions(base=str(tiny_model_dir), save_to=str(first), **opts))
    merge(MergeOptions(base=str(first), save_to=str(second), config_dir=str(tiny_model_dir),
                       **opts))
    inputs = fixed_inputs(merged_pipeline(first, tiny_model_dir).tokenizer)
    want = outputs(diffusers_with(tiny_model_dir, [(loras[1], 1.0)]), inputs)
    got = outputs(merged_pipeline(second, tiny_model_dir), inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


def test_loha_merges_as_peft_computes_it(tiny_model_dir, tmp_path):
    """A LyCORIS LoHa file (hada_* keys) against peft's LoHa layers as the reference."""
    from peft import LoHaConfig
    from safetensors.torch import save_file

    from trainer.export.lora import kohya_module_name
    from trainer.families.sd.tiny import build_components
    from trainer.tools.targets import LAYERS

    comps = build_components()
    unet = comps["unet"]
    unet.add_adapter(LoHaConfig(r=3, alpha=6.0, target_modules=["to_q", "conv1"]))
    gen = torch.Generator().manual_seed(3)
    tensors = {}
    with torch.no_grad():
        for name, module in unet.named_modules():
            if not hasattr(module, "hada_w1_a") or isinstance(module, LAYERS):
                continue
            key = kohya_module_name("lora_unet", name)
            for part in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"):
                param = getattr(module, part)["default"]
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
                tensors[f"{key}.{part}"] = param.detach().clone()
            tensors[f"{key}.alpha"] = torch.tensor(6.0)
    path = tmp_path / "loha.safetensors"
    save_file(tensors, str(path), metadata={"ss_network_module": "lycoris.kohya"})
    out = tmp_path / "loha-merged.safetensors"
    merge(MergeOptions(base=str(tiny_model_dir), loras=[str(path)], save_to=str(out),
                       precision="fp32"))
    inputs = fixed_inputs(comps["tokenizer"])
    with torch.no_grad():
        want = unet(inputs[0], 10, inputs[1]).sample
    got = outputs(merged_pipeline(out, tiny_model_dir), inputs)[0]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_a_lora_of_another_family_is_refused(tiny_model_dir, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "sdxl.safetensors"
    save_file({"lora_te2_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": torch.ones(2, 4),
               "lora_te2_text_model_encoder_layers_0_mlp_fc1.lora_up.weight": torch.ones(4, 2)},
              str(path))
    with pytest.raises(ToolError, match="another model family"):
        merge(MergeOptions(base=str(tiny_model_dir), loras=[str(path)],
                           save_to=str(tmp_path / "x.safetensors")))
    assert not (tmp_path / "x.safetensors").exists()


def test_options_are_checked_by_name():
    with pytest.raises(OptionsError) as err:
        validate(MergeOptions, {"base": "b", "loras": ["a", "b"], "weights": [1.0]})
    assert "weights" in str(err.value)
    with pytest.raises(OptionsError, match="save_to or save_folder"):
        validate(MergeOptions, {"base": "b", "loras": ["a"]})


def test_sdxl_names_merge_where_diffusers_puts_them(tmp_path):
    """SDXL: the UNet's modules under SGM names (input_blocks_4_1_...), lora_te1_/lora_te2_."""
    from diffusers import StableDiffusionXLPipeline
    from peft import LoraConfig, inject_adapter_in_model
    from safetensors.torch import save_file

    from trainer.export.lora import kohya_state_dict, sgm_unet_names
    from trainer.families.sd.tiny import build_sdxl_components, save_tiny_model

    base_dir = save_tiny_model(tmp_path / "sdxl", family="sdxl")
    comps = build_sdxl_components()
    comps["unet"].add_adapter(LoraConfig(r=2, lora_alpha=3.0, target_modules=UNET_TARGETS))
    for i, name in enumerate(("unet", "text_encoder", "text_encoder_2")):
        if name != "unet":  # (diffusers needs out_proj among them to tell the format)
            inject_adapter_in_model(LoraConfig(r=2, lora_alpha=3.0, target_modules=TE_TARGETS),
                                    comps[name])
        randomize(comps[name], seed=20 + i)
    tensors = kohya_state_dict(comps["unet"], comps["text_encoder"], dtype=torch.float32,
                               te_prefix="lora_te1", text_encoder_2=comps["text_encoder_2"],
                               unet_rename=sgm_unet_names(comps["unet"]))
    assert any(k.startswith("lora_unet_input_blocks_") for k in tensors)
    lora = tmp_path / "xl.safetensors"
    save_file(tensors, str(lora))
    merge(MergeOptions(base=str(base_dir), loras=[str(lora)], weights=[0.6],
                       save_folder=str(tmp_path / "merged"), precision="fp32"))
    merged = StableDiffusionXLPipeline.from_pretrained(tmp_path / "merged", local_files_only=True)
    ref = StableDiffusionXLPipeline.from_pretrained(base_dir, local_files_only=True)
    ref.load_lora_weights(str(lora), adapter_name="xl")
    ref.set_adapters(["xl"], [0.6])
    gen = torch.Generator().manual_seed(0)
    sample, hidden = torch.randn(1, 4, 16, 16, generator=gen), torch.randn(1, 77, 80,
                                                                           generator=gen)
    cond = {"text_embeds": torch.randn(1, 48, generator=gen),
            "time_ids": torch.tensor([[64.0, 64, 0, 0, 64, 64]])}
    ids = ref.tokenizer(["a red cat"], padding="max_length", max_length=77,
                        return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(merged.unet(sample, 10, hidden, added_cond_kwargs=cond).sample,
                                   ref.unet(sample, 10, hidden, added_cond_kwargs=cond).sample,
                                   atol=ATOL, rtol=0)
        for enc in ("text_encoder", "text_encoder_2"):
            torch.testing.assert_close(getattr(merged, enc)(ids)[0], getattr(ref, enc)(ids)[0],
                                       atol=ATOL, rtol=0)
