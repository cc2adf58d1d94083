"""LyCORIS (LoCon, LoHa, LoKr) on FLUX.2, Chroma, Qwen-Image and Z-Image (issue 32): each trains
through the normal loop on its tiny twin, and ComfyUI, by its own rules written out here, maps
every key of the file and adds to the original layout's weights exactly what the trained
network adds to diffusers' layers (the check of tests/test_lycoris_flow.py, shared).

ComfyUI's rules (xmarre/ComfyUI @ 6d4f9e86, ``comfy/lora.py`` ``model_lora_keys_unet``): FLUX.2's
and Chroma's models are ``Flux`` subclasses, whose branch maps ``lycoris_`` + a diffusers path
through ``flux_to_diffusers`` (a q / k / v onto its rows of a fused qkv or ``linear1``: an
offset, which ``calculate_weight`` narrows the weight to before the LoRA / LoHa / LoKr adapter
adds its update); its config is read from the original layout (``model_detection``: the width
is ``img_in``'s rows, the blocks counted). Qwen-Image's branch maps ``lycoris_`` + each of its
model's keys, which are diffusers' names. Z-Image's (``Lumina2``) maps ``lycoris_`` + a diffusers
path through ``z_image_to_diffusers`` (tests/test_zimage_lora.py ports it). Chroma's T5, its only
text encoder, is ComfyUI's ``lora_te1_``. The original layouts come from the families' checkpoint
writers, whose own tests check them against diffusers' readers; here each mapped weight's rows
are also checked to be the diffusers layer's weight.
"""

from __future__ import annotations

import contextlib
import re
from functools import cache

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from test_lycoris_flow import (
    assert_comfyui_adds,
    comfy_t5_map,
    flux_to_diffusers,
    network_updates,
    trained,
)
from test_zimage_lora import comfy_native_keys

from trainer.methods.lycoris import LycorisMethod

pytestmark = pytest.mark.usefixtures("no_network")
FAMILIES = {"flux2": "embedded:tiny-flux2", "chroma": "embedded:tiny-chroma",
            "qwen_image": "embedded:tiny-qwen-image", "zimage": "embedded:tiny-zimage"}
TYPES = ("locon", "loha", "lokr")
# the text encoders a family's LyCORIS trains with its transformer (FLUX.2's, Qwen-Image's
# and Z-Image's LoRA train the transformer only); LoKr at rank 2 factors w2 on the tiny widths
TEXT = {"chroma": {"train_text_encoder": True}}
ADAPTER = {"locon": "lora", "loha": "loha", "lokr": "lokr"}  # ComfyUI's adapter of each type


def run_of(tmp_path_factory, family: str, network_type: str):
    """(config, file, updates) of a 2-step run of ``network_type`` on the family's twin."""
    network = {"network_dim": 2 if network_type == "lokr" else 4,
               **(TEXT.get(family, {}) if network_type == "lokr" else {})}
    return trained(tmp_path_factory, network_type, FAMILIES[family], network,
                   {"mixed_precision": "no"})


@cache
def base(family: str):
    from trainer.config import ModelSection
    from trainer.models.loader import load_base_model

    return load_base_model(ModelSection(pretrained_model_name_or_path=FAMILIES[family]))


def original_layout(family: str, transformer) -> dict[str, torch.Tensor]:
    """The transformer's weights in the layout ComfyUI's model holds (bare keys)."""
    if family == "flux2":
        from trainer.families.flux2.checkpoint import bfl_tensors

        return bfl_tensors(transformer)
    if family == "chroma":
        from trainer.families.chroma.checkpoint import chroma_tensors

        return chroma_tensors(transformer)
    if family == "zimage":
        from trainer.families.zimage.checkpoint import native_tensors

        return native_tensors(transformer)
    from trainer.families.qwen_image.checkpoint import qwen_state_dict

    return qwen_state_dict({"transformer": transformer})


def count(keys, block: str) -> int:
    found = [int(m.group(1)) for k in keys if (m := re.match(rf"{block}\.(\d+)\.", k))]
    return max(found) + 1 if found else 0


def comfy_unet_map(family: str, original: dict, config: dict) -> dict:
    """ComfyUI's ``lycoris_`` names of the family's model: name -> ((weight, offset or None),
    diffusers path), for the weights its model has."""
    if family in ("flux2", "chroma"):  # the Flux branch
        paths = flux_to_diffusers(count(original, "double_blocks"),
                                  count(original, "single_blocks"),
                                  original["img_in.weight"].shape[0])
    elif family == "zimage":  # the Lumina2 branch
        paths = {k[:-len(".weight")]: v if isinstance(v, tuple) else (v, None)
                 for k, v in comfy_native_keys(config).items() if k.endswith(".weight")}
    else:  # the QwenImage branch: its keys are diffusers' names
        paths = {k[:-len(".weight")]: (k, None) for k in original if k.endswith(".weight")}
    return {"lycoris_" + path.replace(".", "_"): (target, path)
            for path, target in paths.items() if target[0] in original}


def comfy_key_map(family: str, model) -> dict:
    """name -> ((original weight, offset), (component, path)): the transformer's, and
    Chroma's T5 (``lora_te1_``)."""
    original = original_layout(family, model.denoiser)
    out = {name: (target, ("denoiser", path)) for name, (target, path) in
           comfy_unet_map(family, original, dict(model.denoiser.config)).items()}
    if family == "chroma":
        out.update({name: (target, ("text_encoder", path)) for name, (target, path) in
                    comfy_t5_map(model.text_encoder.state_dict(), index=1).items()})
    return out


@pytest.mark.parametrize("network_type", TYPES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_comfyui_maps_every_key_and_adds_the_trained_update(tmp_path_factory, family,
                                                           network_type):
    _, path, updates = run_of(tmp_path_factory, family, network_type)
    model = base(family)
    key_map = comfy_key_map(family, model)
    original = {**original_layout(family, model.denoiser),
                **{f"t5xxl.transformer.{k}": v for k, v in model.text_encoder.state_dict().items()}}
    roots = {"denoiser": model.denoiser, "text_encoder": model.text_encoder}
    for (weight, offset), (component, module_path) in key_map.values():
        if (component, module_path) in updates:  # ComfyUI's rows hold that diffusers layer
            rows = original[weight].narrow(*offset) if offset else original[weight]
            layer = roots[component].get_submodule(module_path).weight
            assert torch.equal(rows, layer), module_path
    patches = assert_comfyui_adds(load_file(path), key_map, updates,
                                  lambda weight, _: tuple(original[weight].shape))
    assert {kind for kind, _, _ in patches.values()} == {ADAPTER[network_type]}
    assert any(off for (_, off), _ in (key_map[n] for n in patches)) == (
        family != "qwen_image")  # the fused layers' rows (Qwen-Image fuses none)
    if network_type == "lokr" and family in TEXT:
        assert any(c == "text_encoder" for c, _ in updates)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_metadata_names_the_family_and_lycoris(tmp_path_factory, family):
    from trainer.families import spec

    _, path, _ = run_of(tmp_path_factory, family, "lokr")
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "lycoris.kohya"
    assert '"algo": "lokr"' in meta["ss_network_args"]
    assert meta["ss_base_model_version"] == spec(family).kohya_version


@pytest.mark.parametrize("family, network_type", [("flux2", "loha"), ("chroma", "lokr"),
                                                  ("zimage", "lokr")])
def test_network_weights_continue_from_the_file(tmp_path_factory, family, network_type):
    """network.network_weights loads every module of the file back: the network then adds
    what the trained one added."""
    from trainer.models.loader import load_base_model

    cfg, path, updates = run_of(tmp_path_factory, family, network_type)
    again = cfg.model_copy(update={"network": cfg.network.model_copy(
        update={"network_weights": path})})
    model = load_base_model(again.model)
    method = LycorisMethod(again)
    method.prepare(model)
    loaded = network_updates(model, method.loras)
    assert loaded.keys() == updates.keys()
    for key, want in updates.items():
        torch.testing.assert_close(loaded[key], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family, network_type", [("flux2", "loha"), ("chroma", "lokr"),
                                                  ("qwen_image", "lokr"), ("zimage", "loha")])
def test_tools_merge_adds_the_trained_update(tmp_path_factory, tmp_path, family, network_type):
    """tools merge reads the file: the merged diffusers folder's layers (Chroma's T5 too) are
    the base's plus what the trained network added."""
    from trainer.config import ModelSection
    from trainer.models.loader import load_base_model, resolve_model_path
    from trainer.tools.merge import merge
    from trainer.tools.options import MergeOptions

    _, path, updates = run_of(tmp_path_factory, family, network_type)
    report = merge(MergeOptions(base=str(resolve_model_path(FAMILIES[family])), loras=[path],
                                save_folder=str(tmp_path / "m"), precision="fp32"))
    assert not report.loras[0].unmatched and report.loras[0].applied == len(updates)
    merged = load_base_model(ModelSection(pretrained_model_name_or_path=str(tmp_path / "m")))
    for (component, module_path), want in updates.items():
        old, new = (getattr(m, component).get_submodule(module_path).weight.double()
                    for m in (base(family), merged))
        torch.testing.assert_close(new - old, want, rtol=1e-4, atol=1e-6)


@torch.no_grad()
def peft_updates(transformer) -> dict:
    """(denoiser, path) -> what each adapter diffusers loaded adds to its layer's weight."""
    out = {}
    for path, module in transformer.named_modules():
        layer = getattr(module, "base_layer", None)
        if isinstance(layer, torch.nn.Linear):
            eye = torch.eye(layer.in_features, dtype=layer.weight.dtype)
            out[("denoiser", path)] = (module(eye) - layer(eye)).T.double()
    return out


@pytest.mark.parametrize("network_type", TYPES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_what_diffusers_does_with_the_file(tmp_path_factory, family, network_type):
    """diffusers 0.42's ``load_lora_weights``: FLUX.2's pipeline reads a ``lycoris_`` LoKr
    (``_convert_lycoris_flux2_lokr_to_diffusers``) and adds exactly the trained update; no
    other family's pipeline applies any of these files (it raises or loads nothing), which
    the README says: ComfyUI is their reader."""
    from diffusers import DiffusionPipeline

    from trainer.models.loader import resolve_model_path

    _, path, updates = run_of(tmp_path_factory, family, network_type)
    pipe = DiffusionPipeline.from_pretrained(resolve_model_path(FAMILIES[family]))
    if (family, network_type) == ("flux2", "lokr"):
        pipe.load_lora_weights(path)
        loaded = peft_updates(pipe.transformer)
        assert loaded.keys() == updates.keys()
        for key, want in updates.items():
            torch.testing.assert_close(loaded[key], want, rtol=1e-4, atol=1e-6)
        return
    with contextlib.suppress(Exception):
        pipe.load_lora_weights(path)
    assert not peft_updates(pipe.transformer)


def test_a_family_without_lycoris_is_named_in_the_refusal():
    """The refusal of a LyCORIS type on a family whose spec has no ``lycoris`` names it."""
    import dataclasses

    from trainer.config import TrainConfig
    from trainer.config.rules.family import lycoris_problems
    from trainer.families import spec

    net = TrainConfig.model_validate({"network": {"network_type": "lokr"}}).network
    for family in FAMILIES:
        s = dataclasses.replace(spec(family), lycoris=False)
        (message,) = lycoris_problems(net, s)
        assert s.label in message and "network.network_type" in message
        assert lycoris_problems(net, spec(family)) == []


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_gui_shows_the_lycoris_settings_for_the_family(family):
    from kohya_gui.family_view import applies

    for path in ("network.network_type", "network.factor", "network.decompose_both",
                 "network.use_scalar", "network.rank_dropout", "network.module_dropout"):
        assert applies(path, family), path
