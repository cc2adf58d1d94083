"""The generated form, without a browser: every schema field has its component, values
round-trip component -> config -> TOML -> component, presets fill the form, and bad values are
reported by field name with no job started."""

from __future__ import annotations

from typing import Any, Optional

import gradio as gr
import pytest
import tomllib
from gui_helpers import fake_run, gui_home  # noqa: F401

from kohya_gui import presets
from kohya_gui.fields import (
    TRISTATE,
    FieldSpec,
    Form,
    field_specs,
    from_widget,
    get_path,
    search,
    search_updates,
    to_widget,
)
from kohya_gui.runner import Runner
from kohya_gui.tabs import dreambooth, lora, mode_tab, textual_inversion
from trainer.config import MODES, iter_fields, ui_hints
from trainer.config import files as config_io
from trainer.config.rules.family import hinted
from trainer.families import spec as spec_of

TABS = {m.MODE: m for m in (lora, dreambooth, textual_inversion)}


@pytest.fixture(scope="module")
def tabs(gui_home):  # noqa: F811
    run = fake_run()
    runner = Runner(run, write_config=False)
    with gr.Blocks():
        built = {mode: module.build(runner) for mode, module in TABS.items()}
    yield built, runner, run
    runner.close()


def base_values(form: Form) -> dict[str, Any]:
    values = form.defaults()
    if form.mode == "textual_inversion":
        values["network.token_string"] = "<tok>"
    return values


# Settings whose valid values a generic rule cannot guess (names, patterns, per-block lists)
SPECIAL = {"optimizer.optimizer_class": "torch.optim.SGD",
           "optimizer.lr_scheduler_type": "StepLR",
           "saving.huggingface_repo_id": "someone/a-lora",
           "network.down_lr_weight": "cosine", "network.up_lr_weight": "sine+1",
           "network.mid_lr_weight": "0.5",
           "network.block_dims": [4] * 25, "network.block_alphas": [2.0] * 25,
           "network.conv_block_dims": [4] * 25, "network.conv_block_alphas": [2.0] * 25,
           "optimizer.block_lr": [1e-5] * 23}


def other_value(spec: FieldSpec) -> Any:
    """A valid config value different from the default."""
    if spec.path in SPECIAL:
        return SPECIAL[spec.path]
    b, default = spec.bounds, spec.default
    if spec.kind == "bool":
        return not default
    if spec.choices == TRISTATE:  # an Optional[bool]: unset by default
        return False
    if spec.kind == "choice":
        return next(c for c in spec.choices if c != default)
    if spec.kind == "int":
        step = b.get("multiple_of", 1)
        if default is None:
            return b.get("ge", b.get("gt", 0) + 1)
        return default + step if default + step <= b.get("le", default + step) else default - step
    if spec.kind == "float":
        if default in (None, 0, 0.0):
            return b.get("ge", b.get("gt", 0.0)) + 0.5
        return default * 2
    if spec.kind == "list":
        return ["a photo of sks", "a drawing of sks"]
    if spec.kind == "dict":
        return {"d_coef": 2.0, "use_bias": True, "betas_name": "x"}
    if spec.name == "caption_extension":
        return ".caption"
    if spec.path == "dataset.resolution":  # an int or [width, height], shown as TOML text
        return [512, 768]
    return f"value-{spec.name}"


COMPANIONS = {"network.conv_alpha": {"network.conv_dim": 4},
              "dataset.num_class_images": {"dataset.reg_data_dir": "/tmp/class-images"},
              "network.train_unet": {"network.train_text_encoder": True},  # else nothing trains
              "dataset.alpha_mask": {"training.masked_loss": True},
              "dataset.mask_data_dir": {"training.masked_loss": True},
              "training.masked_loss": {"dataset.alpha_mask": True},
              "training.adaptive_noise_scale": {"training.noise_offset": 0.1},
              "training.noise_offset_random_strength": {"training.noise_offset": 0.1},
              # (a setting of some families only gets a model of one: family_companion)
              "network.train_t5xxl": {"network.train_text_encoder": True},
              # settings that need another to mean anything
              "dataset.color_aug": {"dataset.cache_latents": False},
              "training.full_fp16": {"training.mixed_precision": "fp16"},
              "training.blocks_to_swap": {"training.gradient_checkpointing": True},
              "network.dim_from_weights": {"network.network_weights": "/tmp/lora.safetensors"},
              "network.block_alphas": {"network.block_dims": [4] * 25},
              "network.conv_block_dims": {"network.block_dims": [4] * 25},
              "network.conv_block_alphas": {"network.block_dims": [4] * 25,
                                            "network.conv_block_dims": [4] * 25},
              "optimizer.lr_scheduler_type": {"optimizer.lr_scheduler_args": {"step_size": 2}},
              **{f"saving.{name}": {"saving.huggingface_repo_id": "someone/a-lora"}
                 for name in ("async_upload",)},
              "saving.save_state_to_huggingface": {"saving.huggingface_repo_id": "someone/a-lora",
                                                   "saving.save_state": True},
              "saving.resume_from_huggingface": {"training.resume": "someone/a-lora/x-state"},
              **{f"saving.save_last_n_{unit}{state}": {f"saving.save_every_n_{unit}": 1,
                                                      "saving.save_state": True}
                 for unit in ("epochs", "steps") for state in ("", "_state")},
              **{f"network.{name}": {"network.network_type": "boft"}
                 for name in ("constraint", "rescaled")},
              **{f"network.{name}": {"network.network_type": "loha"}
                 for name in ("bypass_mode", "lycoris_preset")},
              # LyCORIS options: refused for a network_type that does not read them
              **{f"network.{name}": {"network.network_type": "lokr"}
                 for name in ("factor", "decompose_both", "use_tucker", "use_scalar",
                              "rank_dropout", "module_dropout", "train_norm")}}


def test_every_field_has_its_component_in_its_modes(tabs):
    built, _, _ = tabs
    for mode, tab in built.items():
        expected = {f"{s}.{n}" for s, n, info in iter_fields()
                    if s and mode in ui_hints(info)["modes"]}  # no mode box: the tab is it
        assert set(tab.form.components) == expected, mode
        for path, comp in tab.form.components.items():
            spec = tab.form.specs[path]
            number = spec.kind in ("int", "float")
            kind = {"bool": gr.Checkbox, "choice": gr.Dropdown}.get(spec.kind, gr.Textbox)
            if number and not spec.optional:
                kind = gr.Number  # an unset-able number is a textbox: gr.Number cannot be empty
            assert isinstance(comp, kind), path
            assert comp.label == spec.label != spec.name and spec.help in comp.info, path
            assert comp.info.startswith(f"`{spec.name}` "), path  # the TOML key, small
            if number and spec.optional and spec.bounds:
                assert ">" in comp.info or "<" in comp.info, path
            if number and not spec.optional:
                assert comp.minimum == spec.bounds.get("ge", spec.bounds.get("gt")), path
                assert comp.maximum == spec.bounds.get("le", spec.bounds.get("lt")), path
    assert "network.network_dim" not in built["textual_inversion"].form.components
    assert "network.token_string" not in built["lora"].form.components
    assert "mode" not in built["lora"].form.components


def _accordion(comp) -> gr.Accordion:
    parent = comp.parent
    while not isinstance(parent, gr.Accordion):
        parent = parent.parent
    return parent


def test_sections_are_open_and_advanced_fields_closed(tabs):
    built, _, _ = tabs
    for path, comp in built["lora"].form.components.items():
        acc = _accordion(comp)
        if built["lora"].form.specs[path].advanced:
            assert acc.label == "Advanced" and acc.open is False, path
            assert _accordion(acc).open is True
        else:
            assert acc.label != "Advanced" and acc.open is True, path


def family_companion(path: str, mode: str) -> Optional[dict[str, Any]]:
    """A setting that only some families read (its ``families`` hint) is refused for the
    default model's: the embedded model of a family that reads it; None where no family that
    reads it has this mode."""
    hints = {f"{s}.{n}": families for s, n, _, families in hinted()}
    if path not in hints or "sd1" in hints[path]:
        return {}
    for family in hints[path]:
        found = spec_of(family)
        if found.embedded and (mode != "textual_inversion" or found.textual_inversion):
            return {"model.pretrained_model_name_or_path": found.embedded}
    return None


@pytest.mark.parametrize("mode", MODES)
def test_every_value_round_trips_through_toml(tabs, mode):
    form = tabs[0][mode].form
    for path, spec in form.specs.items():
        model = family_companion(path, mode)
        if path == "mode" or model is None:
            continue
        new = other_value(spec)
        values = base_values(form)
        for other, value in {**model, **COMPANIONS.get(path, {})}.items():
            values[other] = to_widget(form.specs[other], value)
        shown = to_widget(spec, new)
        assert form.components[path].postprocess(shown) == shown, path
        values[path] = shown
        cfg = form.config(values)
        assert get_path(cfg, path) == new, path
        again = config_io.from_dict(config_io.load_toml_text(config_io.dumps(cfg)))
        assert get_path(again, path) == new, path
        assert form.values(again)[path] == shown, path


def test_empty_optional_means_unset_and_zero_is_a_value():
    specs = {s.path: s for s in field_specs()}
    assert from_widget(specs["training.max_train_steps"], None) is None
    assert from_widget(specs["training.max_train_steps"], " ") is None
    assert from_widget(specs["training.max_train_steps"], "12") == 12
    assert from_widget(specs["training.noise_offset"], "0") == 0.0
    with pytest.raises(ValueError, match="training.noise_offset = 'abc': not a number"):
        from_widget(specs["training.noise_offset"], "abc")
    assert from_widget(specs["model.vae"], "  ") is None
    assert from_widget(specs["model.prediction_type"], "") is None
    assert from_widget(specs["optimizer.max_grad_norm"], 0) == 0
    assert from_widget(specs["dataset.resolution"], "512") == 512  # a text field: one side
    assert from_widget(specs["dataset.resolution"], "[512, 768]") == [512, 768]  # or [w, h]
    assert to_widget(specs["dataset.resolution"], [512, 768]) == "512,768"  # as kohya_ss
    assert from_widget(specs["dataset.resolution"], "512,768") == "512,768"  # the schema's
    assert from_widget(specs["optimizer.optimizer_args"], "{d_coef = 2.0}") == {"d_coef": 2.0}
    assert from_widget(specs["optimizer.optimizer_args"], '{"d_coef": 2}') == {"d_coef": 2}
    assert from_widget(specs["sampling.sample_prompts"], "a\n\n b \n") == ["a", "b"]
    tristate = specs["network.train_text_encoder_2"]  # Optional[bool]: unset, on, off
    assert [from_widget(tristate, v) for v in ("", "on", "off")] == [None, True, False]
    assert [to_widget(tristate, v) for v in (None, True, False)] == ["", "on", "off"]


@pytest.mark.parametrize("mode", MODES)
def test_presets_fill_the_form_and_save_back_the_same_toml(tabs, mode):
    form = tabs[0][mode].form
    listed = presets.list_presets(mode)
    assert listed, f"no {mode} presets"
    for label, path in listed:
        values, msg = mode_tab.load_preset(form, path)
        assert values is not None, msg
        original = presets.read_config(path, mode)
        cfg = form.config(values)
        assert cfg == original
        saved_msg, saved = mode_tab.save_preset(form, values, f"copy of {label}")
        assert saved, saved_msg
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
        raw.setdefault("mode", mode)
        if mode == "lora":
            raw.pop("mode")  # the default mode is not written
        with open(saved, "rb") as fh:
            assert tomllib.load(fh) == raw
        again, _ = mode_tab.load_preset(form, f"copy of {label}{presets.USER_TAG}")
        assert again == values


def test_config_file_save_and_load(tabs, tmp_path):
    form = tabs[0]["lora"].form
    values = base_values(form)
    values["network.network_dim"] = 32
    target = tmp_path / "job.toml"
    assert "Saved" in mode_tab.save_config_file(form, values, str(target))
    loaded, msg = mode_tab.load_config_file(form, str(target))
    assert loaded == values, msg
    wrong, msg = mode_tab.load_config_file(tabs[0]["dreambooth"].form, str(target))
    assert wrong is None and "lora" in msg
    missing, msg = mode_tab.load_config_file(form, str(tmp_path / "nope.toml"))
    assert missing is None and "not found" in msg


@pytest.mark.parametrize(("path", "value", "named"), [
    ("optimizer.learning_rate", 0, "optimizer.learning_rate"),
    ("dataset.resolution", None, "dataset.resolution"),
    ("dataset.resolution", 100, "dataset.resolution"),
    ("optimizer.optimizer_args", "d_coef = = 2", "optimizer.optimizer_args"),
    ("saving.output_name", "a/b", "saving.output_name"),
    ("network.conv_alpha", 4.0, "network.conv_dim"),
])
def test_invalid_values_name_the_field_and_start_nothing(tabs, path, value, named):
    built, runner, run = tabs
    form = built["lora"].form
    values = base_values(form)
    values[path] = value
    message = mode_tab.train(form, values, runner, available=True)
    assert named in message and "Not started" in message
    assert run.calls == [] and runner.snapshot()["status"] == "idle"


def test_every_mode_trains_and_a_bad_mode_config_is_refused_by_field(tabs):
    built, runner, run = tabs
    assert all(tab.available for tab in built.values())
    bad = mode_tab.train(built["textual_inversion"].form,
                         built["textual_inversion"].form.defaults(), runner, True)
    assert "network.token_string" in bad
    assert run.calls == []


def test_no_tab_says_its_mode_cannot_train_and_a_future_one_would(tabs):
    built, runner, run = tabs
    root = built["lora"].parts["train"]
    while root.parent is not None:
        root = root.parent
    texts = [str(b.value) for b in root.blocks.values() if isinstance(b, gr.Markdown)]
    assert texts and not [t for t in texts if "not available" in t or "LoRA tab" in t]
    form = built["dreambooth"].form
    message = mode_tab.train(form, base_values(form), runner, available=False)
    assert message.startswith("**DreamBooth training is not available yet.**")
    assert "LoRA tab" not in message and run.calls == []


def test_new_settings_show_only_in_their_modes_tabs(tabs):
    built = tabs[0]
    where = {path: {m for m, tab in built.items() if path in tab.form.components}
             for path in ("dataset.num_class_images", "dataset.class_prompt",
                          "network.stop_text_encoder_training", "network.caption_templates",
                          "saving.intermediate_diffusers", "model.tokenizer", "model.config_dir",
                          "model.cache_as_diffusers")}
    assert where == {
        "dataset.num_class_images": {"lora", "dreambooth"},
        "dataset.class_prompt": {"lora", "dreambooth"},
        "network.stop_text_encoder_training": {"lora", "dreambooth"},
        "network.caption_templates": {"textual_inversion"},
        "saving.intermediate_diffusers": {"dreambooth"},
        "model.tokenizer": set(MODES), "model.config_dir": set(MODES),
        "model.cache_as_diffusers": set(MODES)}


def test_tab_availability_matches_the_trainer():
    from trainer.config import TrainConfig
    from trainer.methods import MethodUnavailable, get_method

    for mode, module in TABS.items():
        try:
            get_method(TrainConfig.model_construct(mode=mode))
            works = True
        except MethodUnavailable:
            works = False
        assert module.AVAILABLE is works, mode


def test_check_dataset_shows_steps_and_buckets(tabs):
    form = tabs[0]["lora"].form
    values, _ = mode_tab.load_preset(form, "default")
    text = mode_tab.dataset_info(form, values)
    assert "x repeats" in text and "steps" in text, text
    assert "| bucket" in text and "x" in text
    values["dataset.train_data_dir"] = "/no/such/folder"
    assert "cannot be used" in mode_tab.dataset_info(form, values)


def test_utilities_report_and_config_check(tmp_path):
    from kohya_gui.tabs import utilities

    report = utilities.doctor_report()
    assert "torch" in report.lower() and report.rstrip().endswith("]")
    assert "valid **lora** config" in utilities.check_config_file(str(presets.find_preset(
        "lora", "default")))
    bad = tmp_path / "bad.toml"
    bad.write_text("[optimizer]\nlearning_rate = -1\n")
    assert "optimizer.learning_rate" in utilities.check_config_file(str(bad))


def test_a_new_page_starts_from_the_default_preset(tabs):
    """The README says: open the page, keep the default preset and click Train."""
    tab = tabs[0]["lora"]
    values = {p: c.value for p, c in tab.form.components.items()}
    default = presets.find_preset("lora", "default")
    assert tab.form.config(values) == config_io.load(default)
    assert tab.parts["preset"].value == str(default)


def test_every_setting_has_a_readable_label():
    for section, name, info in iter_fields():
        label = ui_hints(info).get("label")
        assert label and label != name and "_" not in label, f"{section}.{name}: {label!r}"
    labels = {s.path: s.label for s in field_specs()}
    assert labels["network.network_dim"] == "Network rank (dim)"
    assert labels["optimizer.lr_warmup_steps"] == "Learning-rate warm-up steps"


def test_search_finds_fields_by_label_key_or_help(tabs):
    form = tabs[0]["lora"].form
    specs = list(form.specs.values())
    assert {"training.min_snr_gamma", "training.zero_terminal_snr"} <= search(specs, "snr")
    assert search(specs, "SNR gamma") == {"training.min_snr_gamma"}  # every word must match
    assert search(specs, "warm-up fraction") == {"optimizer.lr_warmup_ratio"}  # by its label
    assert "network.network_dim" in search(specs, "network_dim")  # by its key
    assert "network.network_alpha" in search(specs, "scaled by")  # by its help
    assert search(specs, "  ") == set(form.specs)
    updates = search_updates(form, "snr")
    comps = form.components
    assert updates[comps["training.min_snr_gamma"]]["visible"] is True
    assert updates[comps["network.network_dim"]]["visible"] is False
    training, advanced = form.accordions["training"]
    assert updates[training].visible is True and updates[advanced].open is True
    assert updates[form.accordions["network"][0]].visible is False  # no match there
    back = search_updates(form, "")
    assert all(back[c]["visible"] for c in comps.values())
    assert back[advanced].open is False and back[form.accordions["network"][0]].visible


def test_the_advisor_panel_estimates_the_form_and_applies_its_advice(tabs):
    from kohya_gui import advisor_panel
    from trainer.system.device import DeviceInfo

    form = tabs[0]["lora"].form
    values, _ = mode_tab.load_preset(form, "default")
    card = DeviceInfo("rocm", "AMD Radeon RX 7600", "cuda:0", 8 * 2**30, True, True, "2.13.0")
    short, report, usable = advisor_panel.advice_for(form, values, card)
    assert "Estimated peak memory" in short and "| **total** |" in report
    titles = [u["title"] for u in usable]
    assert "Turn on gradient checkpointing" in titles  # under 16 GB
    assert "bf16 mixed precision" not in titles  # auto already picks it: nothing to apply
    changes = usable[titles.index("Turn on gradient checkpointing")]["changes"]
    assert advisor_panel.applied(form, changes) == {"training.gradient_checkpointing": True}
    values.update(advisor_panel.applied(form, changes))
    after = [u["title"] for u in advisor_panel.advice_for(form, values, card)[2]]
    assert "Turn on gradient checkpointing" not in after
    values["optimizer.learning_rate"] = -1
    short, report, usable = advisor_panel.advice_for(form, values, card)
    assert "optimizer.learning_rate" in short and report == "" and usable == []
