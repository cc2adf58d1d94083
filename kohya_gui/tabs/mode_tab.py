"""What every mode tab shares: presets, config files, search, the generated form, Check
dataset, and the controls that the page shows beside the form: Train and the advisor.

A mode tab module (lora.py, dreambooth.py, textual_inversion.py) only says which mode it is, the
order of its sections and whether its mode can be trained (all three can; a future mode may
start as editable settings only, and then says so). The tab itself holds one compact row of
presets and config files, a search box and the form; :func:`train_button` and
:func:`build_controls` make the mode's Train button, its message and its advisor wherever the
page puts them (app.py: the panel beside the form), and :func:`wire` connects it all. Handlers
receive the form as ``{component: value}`` (the form's components as an input set) and pass it
through ``Form.config`` - the one validation path - so a bad value is reported naming its field
and no job is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from kohya_gui import advisor_panel, family_view, kohya_import, presets
from kohya_gui.dataset_check import check_dataset
from kohya_gui.fields import Form, build_form
from kohya_gui.runner import QueueFull, Runner, config_copy_path
from trainer.config import TrainConfig
from trainer.config import files as config_io

MODE_TITLES = {"lora": "LoRA", "dreambooth": "DreamBooth", "textual_inversion": "Textual Inversion"}


@dataclass
class ModeTab:
    mode: str
    form: Form
    available: bool
    parts: dict[str, Any] = field(default_factory=dict)


def problems_markdown(exc: config_io.ConfigError, intro: str) -> str:
    from kohya_gui.safe_text import md_lines  # the values quoted come from files: as text

    return f"**{intro}**\n" + md_lines(exc.problems)


def not_available_message(mode: str) -> str:
    title = MODE_TITLES.get(mode, mode)
    return (f"**{title} training is not available yet.** The settings are valid; save them "
            f"as a preset or a config file.")


def _initial_preset(mode: str) -> tuple[str | None, TrainConfig | None, str]:
    """The mode's built-in ``default`` preset, which a new page starts from (if it loads)."""
    try:
        path = presets.find_preset(mode, "default")
        cfg = presets.read_config(path, mode)
    except config_io.ConfigError:
        return None, None, ""
    return str(path), cfg, f"Loaded preset `{path.stem}` ({path})."


def _preset_row(tab: ModeTab, initial_path: str | None, message: str) -> None:
    """Presets, config load and save in one compact row (labels as placeholders)."""
    mode, compact = tab.mode, {"container": False, "show_label": False}
    with gr.Row(equal_height=True, elem_id=f"{mode}-files", elem_classes=["ks-files"]):
        tab.parts["preset"] = gr.Dropdown(
            choices=presets.list_presets(mode), value=initial_path, label="Preset", scale=3,
            min_width=150, filterable=False, elem_id=f"{mode}-preset", **compact)
        tab.parts["refresh"] = gr.Button("↻", scale=0, min_width=36, size="sm",
                                         elem_id=f"{mode}-refresh")
        tab.parts["preset_name"] = gr.Textbox(label="New preset name", scale=2, min_width=110,
                                              placeholder="new preset name", max_lines=1,
                                              elem_id=f"{mode}-preset-name", **compact)
        tab.parts["save_preset"] = gr.Button("Save preset", scale=0, min_width=90, size="sm",
                                             elem_id=f"{mode}-save-preset")
        tab.parts["config_path"] = gr.Textbox(
            label="Config file (.toml)", scale=4, min_width=150, max_lines=1,
            placeholder="config file: /path/to/config.toml",
            elem_id=f"{mode}-config-path", **compact)
        tab.parts["load_config"] = gr.Button("Load", scale=0, min_width=60, size="sm",
                                             elem_id=f"{mode}-load-config")
        tab.parts["save_config"] = gr.Button("Save", scale=0, min_width=60, size="sm",
                                             elem_id=f"{mode}-save-config")
        tab.parts["load_kohya"] = kohya_import.upload_button(mode)
    tab.parts["file_msg"] = gr.Markdown(message, elem_id=f"{mode}-file-msg",
                                        elem_classes=["ks-small"])


def _dataset_extra(tab: ModeTab) -> Callable[[], None]:
    def add() -> None:
        tab.parts["check"] = gr.Button("Check dataset", size="sm", elem_id=f"{tab.mode}-check")
        tab.parts["dataset_md"] = gr.Markdown(elem_id=f"{tab.mode}-dataset-info")
    return add


def build_mode_tab(mode: str, sections: list[str], runner: Runner, available: bool = True,
                   titles: dict[str, str] | None = None, controls: bool = True,
                   info: Any = None) -> ModeTab:
    """Lay out a mode tab in the current Blocks. With ``controls``, Train and the advisor
    follow the form and everything is wired; without, the page makes them elsewhere with
    :func:`train_button` and :func:`build_controls` and then calls :func:`wire`."""
    tab = ModeTab(mode, Form(mode), available)
    if not available:
        gr.Markdown(f"_{MODE_TITLES[mode]} training is not available yet: this tab edits, "
                    f"checks and saves its settings; Train says so._")
    initial_path, initial, message = _initial_preset(mode)
    _preset_row(tab, initial_path, message)
    tab.parts["search"] = gr.Textbox(
        label="Search settings", show_label=False, container=False, max_lines=1,
        placeholder="Search settings by name, key or help (e.g. snr, rank, warm-up)",
        elem_id=f"{mode}-search", elem_classes=["ks-search"])
    tab.form.section_extras["dataset"] = _dataset_extra(tab)
    build_form(tab.form, sections, titles=titles, initial=initial)
    shown = initial or TrainConfig()
    family_view.hide_initially(tab.form, family_view.model_family(
        shown.model.pretrained_model_name_or_path, shown.model.model_version))
    if controls:
        train_button(tab)
        build_controls(tab)
        wire(tab, runner, info)
    return tab


def train_button(tab: ModeTab, visible: bool = True) -> Any:
    tab.parts["train"] = gr.Button(f"Train {MODE_TITLES.get(tab.mode, tab.mode)}",
                                   variant="primary", elem_id=f"{tab.mode}-train", scale=3,
                                   visible=visible)
    return tab.parts["train"]


def build_controls(tab: ModeTab) -> None:
    """The Train message and the advisor, in the current Blocks."""
    tab.parts["train_msg"] = gr.Markdown(elem_id=f"{tab.mode}-train-msg")
    tab.parts["advisor"] = advisor_panel.build(tab.mode)


# --- handlers: plain functions of {path: value}, so the tests call them without a browser ----

def load_preset(form: Form, choice: str | None) -> tuple[dict[str, Any] | None, str]:
    """(form values, message) for a preset path or name."""
    if not choice:
        return None, ""
    try:
        path = presets.find_preset(form.mode, choice)
        cfg = presets.read_config(path, form.mode)
    except config_io.ConfigError as exc:
        return None, problems_markdown(exc, "The preset cannot be loaded:")
    return form.values(cfg), f"Loaded preset `{path.stem}` ({path})."


def load_config_file(form: Form, path: str) -> tuple[dict[str, Any] | None, str]:
    if not (path or "").strip():
        return None, "**Enter the path of a config file to load.**"
    try:
        cfg = presets.read_config(path.strip(), form.mode)
    except config_io.ConfigError as exc:
        return None, problems_markdown(exc, "The config cannot be loaded:")
    return form.values(cfg), f"Loaded `{path.strip()}`."


def save_preset(form: Form, values: dict[str, Any], name: str) -> tuple[str, str | None]:
    """(message, saved path or None)."""
    try:
        cfg = form.config(values)
        path = presets.save_user_preset(cfg, name or "")
    except config_io.ConfigError as exc:
        return problems_markdown(exc, "Not saved:"), None
    except OSError as exc:
        return f"**Not saved:** {exc}", None
    return f"Saved preset `{path.stem}` to {path}.", str(path)


def save_config_file(form: Form, values: dict[str, Any], path: str) -> str:
    if not (path or "").strip():
        return "**Enter the path of the config file to write.**"
    try:
        written = presets.save_config(form.config(values), path.strip())
    except config_io.ConfigError as exc:
        return problems_markdown(exc, "Not saved:")
    except OSError as exc:
        return f"**Not saved:** {exc}"
    return f"Saved the config to `{written}`."


def dataset_info(form: Form, values: dict[str, Any]) -> str:
    try:
        cfg = form.config(values)
    except config_io.ConfigError as exc:
        return problems_markdown(exc, "Fix these settings first:")
    return check_dataset(cfg)


def train(form: Form, values: dict[str, Any], runner: Runner, available: bool) -> str:
    """Validate the form and queue the job; a bad value queues nothing."""
    try:
        cfg = form.config(values)
    except config_io.ConfigError as exc:
        return problems_markdown(exc, "Not started - fix these settings:")
    if not available:
        return not_available_message(form.mode)
    try:
        answer = runner.submit(cfg)
    except QueueFull as exc:
        return f"**Not queued:** {exc}"
    return (f"{answer['message']}; its config goes to `{config_copy_path(cfg)}`.")


def wire(tab: ModeTab, runner: Runner, info: Any = None) -> None:
    """Connect the tab's handlers (after :func:`train_button` and :func:`build_controls`)."""
    form, p, mode = tab.form, tab.parts, tab.mode
    form_outputs = list(form.components.values())

    def fill(values: dict[str, Any] | None, msg: str) -> dict[Any, Any]:
        out: dict[Any, Any] = {p["file_msg"]: msg}
        if values is not None:
            out.update({form.components[k]: v for k, v in values.items()})
        return out

    raw = {"preprocess": False}  # our own validation names the field; gradio's would not
    p["preset"].input(lambda choice: fill(*load_preset(form, choice)), p["preset"],
                      form_outputs + [p["file_msg"]], api_name=f"{mode}_load_preset").then(
        lambda data: dataset_info(form, form.by_path(data)), form.inputs, p["dataset_md"],
        api_visibility="private", **raw)
    p["refresh"].click(lambda: gr.Dropdown(choices=presets.list_presets(mode)), None,
                       p["preset"], api_visibility="private")
    p["load_config"].click(lambda path: fill(*load_config_file(form, path)), p["config_path"],
                           form_outputs + [p["file_msg"]], api_name=f"{mode}_load_config").then(
        lambda data: dataset_info(form, form.by_path(data)), form.inputs, p["dataset_md"],
        api_visibility="private", **raw)
    p["load_kohya"].upload(lambda path: fill(*kohya_import.load_kohya_config(form, path)),
                           p["load_kohya"], form_outputs + [p["file_msg"]],
                           api_name=f"{mode}_load_kohya").then(
        lambda data: dataset_info(form, form.by_path(data)), form.inputs, p["dataset_md"],
        api_visibility="private", **raw)

    def on_save_preset(data: dict[Any, Any]) -> dict[Any, Any]:
        msg, path = save_preset(form, form.by_path(data), data[p["preset_name"]])
        out: dict[Any, Any] = {p["file_msg"]: msg}
        if path:
            out[p["preset"]] = gr.Dropdown(choices=presets.list_presets(mode), value=path)
        return out

    p["save_preset"].click(on_save_preset, form.inputs | {p["preset_name"]},
                           [p["file_msg"], p["preset"]], api_name=f"{mode}_save_preset", **raw)
    p["save_config"].click(
        lambda data: save_config_file(form, form.by_path(data), data[p["config_path"]]),
        form.inputs | {p["config_path"]}, p["file_msg"], api_name=f"{mode}_save_config", **raw)
    p["check"].click(lambda data: dataset_info(form, form.by_path(data)), form.inputs,
                     p["dataset_md"], api_name=f"{mode}_check_dataset", **raw)
    form.components["dataset.train_data_dir"].submit(
        lambda data: dataset_info(form, form.by_path(data)), form.inputs, p["dataset_md"],
        api_visibility="private", **raw)
    p["train"].click(lambda data: train(form, form.by_path(data), runner, tab.available),
                     form.inputs, p["train_msg"], api_name=f"{mode}_train", **raw)
    family_view.wire(form, p["search"])  # search, and the fields of the model's family
    tab.parts["refresh_advice"] = advisor_panel.wire(form, p["advisor"], info)
