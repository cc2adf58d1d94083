"""The Utilities tab's forms, generated from the tools' options (:mod:`trainer.tools.options`).

Nothing here declares an option: each component's kind, default, choices and help come from the
option's type (bool -> checkbox, Literal -> dropdown, int/float -> number, or a textbox when the
option may be unset (empty), str -> textbox, a list -> a textbox with one item per line, or per
comma where the option says so). A
:class:`ToolForm` keeps ``{option name: component}``; :func:`raw_values` turns the components'
values into option values, which :func:`trainer.tools.options.validate` then checks, as it checks
the command line's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from trainer.tools.options import ToolOptions, field_kind, help_of, list_separator

UNSET = "(unset)"
LABELS = {
    "path": "File (.safetensors)", "save_to": "Save to (.safetensors)",
    "save_folder": "Save as a diffusers folder", "config_dir": "Config folder (single files)",
    "loras": "LoRA files (one per line)", "weights": "Weights (one per LoRA, comma-separated)",
    "model_dir": "Model folder", "exclude_tags": "Exclude tags (comma-separated)",
    "base": "Base model", "tuned": "Fine-tuned model",
}


@dataclass
class ToolForm:
    tool: str
    model: type[ToolOptions]
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def inputs(self) -> set[Any]:
        return set(self.fields.values())


def label_of(name: str) -> str:
    return LABELS.get(name, name.replace("_", " ").capitalize())


def _default(model: type[ToolOptions], name: str) -> Any:
    info = model.model_fields[name]
    return None if info.is_required() else info.get_default(call_default_factory=True)


def make_component(tool: str, model: type[ToolOptions], name: str, **extra: Any) -> Any:
    """One option's component, with the id ``<tool>-<option>`` (dashes)."""
    kind, choices, optional = field_kind(model, name)
    default = _default(model, name)
    common = {"label": label_of(name), "info": help_of(model, name),
              "elem_id": f"{tool}-{name.replace('_', '-')}", **extra}
    if kind == "bool":
        return gr.Checkbox(value=bool(default), **common)
    if kind == "choice":
        options = ([UNSET] if optional else []) + list(choices)
        return gr.Dropdown(choices=options, value=UNSET if default is None else default,
                           filterable=False, **common)
    if kind in ("int", "float") and optional:  # a Number cannot be empty: unset is ""
        return gr.Textbox(value="" if default is None else str(default), max_lines=1, **common)
    if kind in ("int", "float"):
        return gr.Number(value=default, precision=0 if kind == "int" else None, **common)
    if kind.startswith("list_"):
        many = kind == "list_text" and list_separator(model, name) == "\n"
        sep = "\n" if many else ", "
        return gr.Textbox(value=sep.join(str(v) for v in default or []), lines=3 if many else 1,
                          max_lines=12 if many else 1, **common)
    return gr.Textbox(value=default or "", max_lines=1, **common)


def build_form(tool: str, model: type[ToolOptions], rows: list[list[str]],
               extra: dict[str, dict[str, Any]] | None = None) -> ToolForm:
    """Components for the options named in ``rows``, one ``gr.Row`` per row."""
    form = ToolForm(tool, model)
    for row in rows:
        with gr.Row():
            for name in row:
                form.fields[name] = make_component(tool, model, name, **(extra or {}).get(
                    name, {}))
    return form


def _list(kind: str, text: Any, sep: str) -> list[Any]:
    if isinstance(text, list):
        return text
    parts = re.split(r"[,\s]+", text or "") if kind == "list_float" else (text or "").split(sep)
    items = [p.strip() for p in parts if p.strip()]
    if kind == "list_float":
        try:
            return [float(p) for p in items]
        except ValueError:
            return items  # refused by validation, naming the option
    return items


def raw_values(model: type[ToolOptions], values: dict[str, Any]) -> dict[str, Any]:
    """Component values by option name -> option values: empty text and unset choices become
    "not given" (the default, or a missing required option), lists are split."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        kind, _, _ = field_kind(model, name)
        if kind.startswith("list_"):
            value = _list(kind, value, list_separator(model, name))
        elif isinstance(value, str):
            value = value.strip()
            if value in ("", UNSET):
                value = None
        if value is None:
            continue
        if kind == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[name] = value
    return out


def form_values(form: ToolForm, data: dict[Any, Any]) -> dict[str, Any]:
    """``{component: value}`` (gradio's set-of-inputs call) -> ``{option name: value}``."""
    return {name: data[component] for name, component in form.fields.items()}
