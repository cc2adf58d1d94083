"""The fields of a model family in view only for a model of that family, without a browser:
the family of the form's model (embedded names, model_version, a diffusers folder's
model_index.json, a .safetensors header), what the form shows for it (FLUX.1's guidance and
timestep fields for tiny-flux, none of them for an SD model), searching, presets, and the
handler the model field and the search box call."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pytest
import torch
from gui_helpers import fake_run, gui_home  # noqa: F401
from safetensors.torch import save_file

from kohya_gui import family_view
from kohya_gui.runner import Runner
from kohya_gui.tabs import dreambooth, lora, mode_tab, textual_inversion

FLUX_ONLY = ("model.ae", "network.train_blocks")
SD3_ONLY = ("model.clip_g",)
FLOW = ("flow.guidance_scale", "flow.timestep_sampling", "flow.discrete_flow_shift",
        "model.clip_l", "model.t5xxl", "model.t5xxl_max_token_length", "network.train_t5xxl")


@pytest.fixture(scope="module")
def tabs(gui_home):  # noqa: F811
    runner = Runner(fake_run(), write_config=False)
    with gr.Blocks() as demo:
        built = {m.MODE: m.build(runner) for m in (lora, dreambooth, textual_inversion)}
    yield built, demo
    runner.close()


def visible(updates, form, path) -> bool:
    return updates[form.components[path]]["visible"]


def shown_for(form, model, version="auto", **values):
    base = {**form.defaults(), family_view.MODEL_PATH: model, family_view.MODEL_VERSION: version}
    return family_view.form_updates(form, {**base, **values})


def test_the_family_of_embedded_models_and_of_model_version():
    assert family_view.model_family("embedded:tiny-flux") == "flux1"
    assert family_view.model_family("embedded:tiny-sd3") == "sd3"
    assert family_view.model_family("embedded:tiny-sdxl") == "sdxl"
    assert family_view.model_family("embedded:tiny-sd15") == "sd1"
    assert family_view.model_family("embedded:tiny-sd15", "flux1") == "flux1"  # the setting wins
    assert family_view.model_family("/no/such/model.safetensors") is None
    assert family_view.model_family("", "auto") is None
    assert family_view.model_family("embedded:nothing") is None


@pytest.mark.parametrize("pipeline, family", [
    ("FluxPipeline", "flux1"), ("StableDiffusion3Pipeline", "sd3"),
    ("StableDiffusionXLPipeline", "sdxl"), ("StableDiffusionPipeline", "sd1"),
    ("KandinskyPipeline", None)])
def test_the_family_of_a_diffusers_folder(tmp_path, pipeline, family):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": pipeline}))
    assert family_view.model_family(str(tmp_path)) == family


def test_sd2_is_told_from_sd1_by_its_text_encoder(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionPipeline"}))
    (tmp_path / "text_encoder").mkdir()
    (tmp_path / "text_encoder" / "config.json").write_text(json.dumps({"hidden_size": 1024}))
    assert family_view.model_family(str(tmp_path)) == "sd2"
    (tmp_path / "model_index.json").write_text("{not json")
    assert family_view.model_family(str(tmp_path)) is None


def _checkpoint(path: Path, encoder: str, context: int) -> Path:
    """A header-only stand-in for an original-layout checkpoint (tiny zero tensors)."""
    unet = "model.diffusion_model."
    save_file({f"{unet}input_blocks.0.0.weight": torch.zeros(8, 4, 1, 1),
               f"{unet}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight":
                   torch.zeros(8, context),
               f"{encoder}final_layer_norm.weight": torch.zeros(4)}, str(path))
    return path


def test_the_family_of_a_single_file_from_its_header(tmp_path):
    sd1 = _checkpoint(tmp_path / "sd1.safetensors", "cond_stage_model.transformer.", 768)
    sd2 = _checkpoint(tmp_path / "sd2.safetensors", "cond_stage_model.model.", 1024)
    assert family_view.model_family(str(sd1)) == "sd1"
    assert family_view.model_family(str(sd2)) == "sd2"
    lora_file = tmp_path / "lora.safetensors"
    save_file({"lora_unet_x.lora_down.weight": torch.zeros(2, 2)}, str(lora_file))
    assert family_view.model_family(str(lora_file)) is None  # not a base model: unknown
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)
    assert family_view.model_family(str(junk)) is None
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"")
    assert family_view.model_family(str(ckpt)) is None


def test_tiny_flux_shows_the_flow_fields_and_hides_sd3_only_ones(tabs):
    form = tabs[0]["lora"].form
    updates = shown_for(form, "embedded:tiny-flux")
    for path in FLOW + FLUX_ONLY:
        assert visible(updates, form, path), path
    for path in SD3_ONLY:
        assert not visible(updates, form, path), path
    outer, inner = form.accordions["flow"]
    assert updates[outer].visible is True
    assert visible(updates, form, "network.network_dim")  # every family's fields stay


def test_tiny_sd3_hides_flux_only_fields(tabs):
    form = tabs[0]["lora"].form
    updates = shown_for(form, "embedded:tiny-sd3")
    for path in FLOW + SD3_ONLY:
        assert visible(updates, form, path), path
    for path in FLUX_ONLY:
        assert not visible(updates, form, path), path


@pytest.mark.parametrize("model, version", [("embedded:tiny-sd15", "auto"),
                                            ("embedded:tiny-sdxl", "auto"),
                                            ("/some/where", "sd2")])
def test_an_sd_model_hides_every_flow_field_and_the_flow_section(tabs, model, version):
    form = tabs[0]["lora"].form
    updates = shown_for(form, model, version)
    for path in FLOW + FLUX_ONLY + SD3_ONLY:
        assert not visible(updates, form, path), path
    assert updates[form.accordions["flow"][0]].visible is False
    assert visible(updates, form, "training.min_snr_gamma")
    assert updates[form.accordions["model"][1]].visible is True  # other advanced fields left


def test_an_unknown_model_shows_every_family_field(tabs):
    form = tabs[0]["lora"].form
    updates = shown_for(form, "/not/there/yet")
    assert all(u["visible"] for c, u in updates.items() if c in form.components.values())


def test_a_set_field_of_another_family_stays_in_view_to_be_fixed(tabs):
    form = tabs[0]["lora"].form
    updates = shown_for(form, "embedded:tiny-sd15", **{"model.clip_l": "/x/clip_l.safetensors"})
    assert visible(updates, form, "model.clip_l")
    assert not visible(updates, form, "model.t5xxl")


def test_search_never_brings_back_another_familys_field(tabs):
    form = tabs[0]["lora"].form
    values = {**form.defaults(), family_view.MODEL_PATH: "embedded:tiny-sd15"}
    sd = family_view.form_updates(form, values, "guidance")
    assert not visible(sd, form, "flow.guidance_scale")
    assert sd[form.accordions["flow"][0]].visible is False
    values[family_view.MODEL_PATH] = "embedded:tiny-flux"
    flux = family_view.form_updates(form, values, "guidance")
    assert visible(flux, form, "flow.guidance_scale")
    assert not visible(flux, form, "network.network_dim")
    assert flux[form.accordions["flow"][0]].visible is True


def test_the_page_starts_with_the_default_presets_family(tabs):
    for mode in ("lora", "dreambooth"):
        form = tabs[0][mode].form
        assert form.components["flow.guidance_scale"].visible is False, mode
        assert form.accordions["flow"][0].visible is False, mode
        assert form.components["network.network_dim" if mode == "lora"
                               else "model.vae"].visible is True


@pytest.mark.parametrize("mode, preset, family", [
    ("lora", "tiny-flux", "flux1"), ("lora", "tiny-sd3", "sd3"),
    ("dreambooth", "tiny-flux", "flux1"), ("lora", "flux1-dev-24gb", "flux1"),
    ("lora", "sd35-large-16gb", "sd3"), ("lora", "default", "sd1")])
def test_a_loaded_preset_shows_its_familys_fields(tabs, mode, preset, family):
    form = tabs[0][mode].form
    values, msg = mode_tab.load_preset(form, preset)
    assert values is not None, msg
    path, version = values[family_view.MODEL_PATH], values[family_view.MODEL_VERSION]
    assert family_view.model_family(path, version) == family
    updates = family_view.form_updates(form, values)
    assert visible(updates, form, "flow.guidance_scale") == (family in ("flux1", "sd3"))


def test_the_model_field_and_the_search_box_are_wired_to_the_view(tabs):
    built, demo = tabs
    tab = built["lora"]
    model = tab.form.components[family_view.MODEL_PATH]
    deps = [fn for fn in demo.fns.values()
            if any(t[0] is not None and t[0] == model._id for t in fn.targets)]
    assert deps, "no handler on the model field"
    data = {tab.form.components[p]: v for p, v in tab.form.defaults().items()}
    data[model] = "embedded:tiny-flux"
    data[tab.parts["search"]] = ""
    out = deps[0].fn(data)
    assert out[tab.form.components["flow.guidance_scale"]]["visible"] is True
    search_deps = [fn for fn in demo.fns.values()
                   if any(t[0] == tab.parts["search"]._id for t in fn.targets)]
    assert search_deps and search_deps[0].fn is not None


CONTROL_FIELDS = ("dataset.control_dir", "dataset.control_resolution")


def test_control_folder_fields_only_for_edit_families(tabs):
    """Edit training's fields follow the registry: in view for a family whose ControlSpec takes
    control images, hidden for every other family, in every mode tab that has them."""
    from trainer.families import FAMILIES

    edit = {name for name, fam in FAMILIES.items() if fam.controls.max > 0}
    assert edit and edit != set(FAMILIES)
    for tab in tabs[0].values():
        form = tab.form
        for name in FAMILIES:
            updates = shown_for(form, "", version=name)
            for path in CONTROL_FIELDS:
                assert visible(updates, form, path) == (name in edit), (tab.mode, name, path)
        kontext = shown_for(form, "embedded:tiny-flux-kontext")
        flux = shown_for(form, "embedded:tiny-flux")
        for path in CONTROL_FIELDS:
            assert visible(kontext, form, path) and not visible(flux, form, path)
        # a loaded config that sets one keeps it in view (the rules then name it)
        kept = shown_for(form, "embedded:tiny-flux", **{"dataset.control_dir": "ctl"})
        assert visible(kept, form, "dataset.control_dir")
