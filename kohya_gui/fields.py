"""The form, generated from the config schema: one component per setting, mapped both ways.

Nothing here declares a setting. :func:`field_specs` reads ``trainer.config.iter_fields()`` and
decides the widget from the type (bool -> checkbox, Literal -> dropdown, int/float -> number with
the schema's bounds, str -> textbox, list[str] -> one item per line, dict -> TOML text); the
label, the help text and the TOML key under it (in small type, for people who know kohya's
names) are the schema's. A mode's form has no ``mode`` box: the tab is the mode. A :class:`Form`
keeps ``{dotted path: component}`` and converts

    component values -> raw dict -> ``config_io.from_dict`` -> TrainConfig
    TrainConfig -> component values

so every way into a config (file, preset, CLI, form) is validated by the same code. Optional
fields: an empty box means unset (``None``). :func:`search` finds fields by label, key or help
and :func:`search_updates` shows only those (opening the sections and parts that hold them).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import tomli_w
import tomllib

from trainer import families
from trainer.config import TrainConfig, iter_fields, ui_hints
from trainer.config import files as config_io

UNSET_LABEL = "(unset)"
TRISTATE = ("on", "off")  # the choices of an Optional[bool]
FLOW_FAMILIES = ", ".join(families.label(n) for n in families.names(objective="flow"))
SECTION_TITLES = {
    "": "Mode", "model": "Model", "dataset": "Dataset", "network": "Network",
    "optimizer": "Optimizer", "training": "Training",
    "flow": f"Flow matching ({FLOW_FAMILIES})", "sampling": "Sample images", "saving": "Saving",
}


@dataclass(frozen=True)
class FieldSpec:
    """What the form needs to know about one setting, read from the schema."""

    path: str
    section: str
    name: str
    label: str  # what people read; the schema's label hint, else the key
    kind: str  # bool | choice | int | float | text | list | dict | toml
    optional: bool
    help: str
    modes: tuple[str, ...]
    advanced: bool
    widget: str | None
    default: Any
    choices: tuple[Any, ...] = ()
    bounds: dict[str, Any] = field(default_factory=dict)


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            inner = args[0] if len(args) == 1 else Union[tuple(args)]
            return inner, True
    return annotation, False


def _kind(annotation: Any) -> tuple[str, tuple[Any, ...]]:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "choice", typing.get_args(annotation)
    if annotation is bool:
        return "bool", ()
    if annotation is int:
        return "int", ()
    if annotation is float:
        return "float", ()
    if annotation is str:
        return "text", ()
    if origin is list and typing.get_args(annotation) == (str,):
        return "list", ()
    if origin is dict:
        return "dict", ()
    return "toml", ()  # anything newer: edited as a TOML value


def _bounds(info: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in info.metadata:
        for key in ("ge", "gt", "le", "lt", "multiple_of"):
            value = getattr(item, key, None)
            if value is not None:
                out[key] = value
    return out


def field_specs(mode: str | None = None) -> list[FieldSpec]:
    """Every setting (or those whose UI modes include ``mode``), in schema order."""
    specs = []
    for section, name, info in iter_fields():
        hints = ui_hints(info)
        if mode is not None and mode not in hints["modes"]:
            continue
        inner, optional = _unwrap_optional(info.annotation)
        kind, choices = _kind(inner)
        if kind == "bool" and optional:  # three states: unset, on, off
            kind, choices = "choice", TRISTATE
        specs.append(FieldSpec(
            path=f"{section}.{name}" if section else name, section=section, name=name,
            label=hints.get("label") or name, kind=kind, optional=optional,
            help=info.description or "",
            modes=tuple(hints["modes"]), advanced=bool(hints.get("advanced")),
            widget=hints.get("widget"), default=info.get_default(call_default_factory=True),
            choices=choices, bounds=_bounds(info),
        ))
    return specs


# --- values: config <-> component ------------------------------------------------------------

def to_widget(spec: FieldSpec, value: Any) -> Any:
    """A config value as the component shows it."""
    if spec.kind == "bool":
        return bool(value)
    if spec.choices == TRISTATE and isinstance(value, bool):
        return "on" if value else "off"
    if spec.kind in ("int", "float"):
        if spec.optional:  # shown in a textbox, see make_component
            return "" if value is None else str(value)
        return value
    if value is None:
        return ""
    if spec.kind == "list":
        return "\n".join(value)
    if spec.kind == "dict":
        return tomli_w.dumps(value).strip()
    if spec.widget == "size":  # 512 or [512, 768] as kohya_ss's max_resolution, "512,768"
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)
    if spec.kind == "toml":
        return tomli_w.dumps({"v": value})[4:].strip()
    return value


class FieldProblem(ValueError):
    """A component value that cannot even be read (the message names the field)."""


def _parse_dict(spec: FieldSpec, text: str) -> dict[str, Any]:
    text = text.strip()
    if not text:
        return {}
    attempts = [lambda: tomllib.loads(text)]
    if text.startswith("{"):
        attempts = [lambda: tomllib.loads("v = " + text)["v"], lambda: json.loads(text)]
    for attempt in attempts:
        try:
            value = attempt()
        except (tomllib.TOMLDecodeError, json.JSONDecodeError):
            continue
        if isinstance(value, dict):
            return value
    raise FieldProblem(f"{spec.path}: write it as TOML (key = value, one a line) or a JSON "
                       f"object, e.g. {{d_coef = 2.0}}")


def _number(spec: FieldSpec, value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            value = int(text) if spec.kind == "int" and text.lstrip("+-").isdigit() \
                else float(text)
        except ValueError:
            raise FieldProblem(f"{spec.path} = {value!r}: not a number") from None
    if spec.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def from_widget(spec: FieldSpec, value: Any) -> Any:
    """A component value as the raw config value (``None`` = unset); raises FieldProblem."""
    if spec.kind == "bool":
        return bool(value)
    if spec.choices == TRISTATE and value in TRISTATE:
        return value == "on"
    if spec.kind in ("int", "float"):
        value = _number(spec, value)
    elif spec.kind == "list":
        value = [line.strip() for line in str(value or "").splitlines() if line.strip()]
    elif spec.kind == "dict":
        value = _parse_dict(spec, str(value or ""))
    elif isinstance(value, str) and not value.strip() and spec.optional:
        value = None
    elif spec.kind == "toml" and isinstance(value, str):
        value = config_io.parse_value(value.strip())
    if value is None and not spec.optional:
        raise FieldProblem(f"{spec.path}: a value is required")
    return value


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    section, _, name = path.rpartition(".")
    (data.setdefault(section, {}) if section else data)[name] = value


def get_path(cfg: TrainConfig, path: str) -> Any:
    section, _, name = path.rpartition(".")
    return getattr(getattr(cfg, section) if section else cfg, name)


# --- the form --------------------------------------------------------------------------------

class Form:
    """The components of one mode's form, keyed by dotted path, and the conversions."""

    def __init__(self, mode: str, specs: list[FieldSpec] | None = None):
        self.mode = mode
        specs = specs if specs is not None else [s for s in field_specs(mode) if s.path != "mode"]
        self.specs = {s.path: s for s in specs}
        self.components: dict[str, Any] = {}
        self.section_extras: dict[str, Any] = {}  # section -> callable adding components there
        self.accordions: dict[str, tuple[Any, Any]] = {}  # section -> (section, its Advanced)

    @property
    def inputs(self) -> set:
        """The components as an input set: handlers receive ``{component: value}``."""
        return set(self.components.values())

    def by_path(self, values: Mapping[Any, Any]) -> dict[str, Any]:
        """``{component: value}`` (a handler's input) -> ``{path: value}``."""
        out = {}
        for path, comp in self.components.items():
            if comp in values:
                out[path] = values[comp]
        return out

    def raw(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``{path: component value}`` -> (raw config dict, problems reading the values)."""
        data: dict[str, Any] = {}
        problems: list[str] = []
        for path, spec in self.specs.items():
            if path not in values:
                continue
            try:
                set_path(data, path, from_widget(spec, values[path]))
            except FieldProblem as exc:
                problems.append(str(exc))
        data["mode"] = self.mode  # the tab decides the mode
        return data, problems

    def config(self, values: Mapping[str, Any]) -> TrainConfig:
        """Validate ``{path: component value}``; raises ConfigError naming every bad field."""
        data, problems = self.raw(values)
        try:
            cfg = config_io.from_dict(data, source="form")
        except config_io.ConfigError as exc:
            raise config_io.ConfigError(problems + exc.problems, "form") from None
        if problems:
            raise config_io.ConfigError(problems, "form")
        return cfg

    def values(self, cfg: TrainConfig) -> dict[str, Any]:
        """``{path: component value}`` showing ``cfg``."""
        return {path: to_widget(spec, get_path(cfg, path)) for path, spec in self.specs.items()}

    def defaults(self) -> dict[str, Any]:
        out = {path: to_widget(spec, spec.default) for path, spec in self.specs.items()}
        if "mode" in out:
            out["mode"] = self.mode
        return out


# --- components ------------------------------------------------------------------------------

def _info(spec: FieldSpec) -> str:
    """The help under the label, after the TOML key in small code type."""
    extra = " Empty = unset." if spec.optional and spec.kind not in ("bool", "choice") else ""
    return f"`{spec.name}` · {spec.help}{extra}"


def _range_words(bounds: dict[str, Any]) -> str:
    words = {"ge": ">= {}", "gt": "> {}", "le": "<= {}", "lt": "< {}"}
    parts = [words[k].format(v) for k, v in bounds.items() if k in words]
    return f" Allowed: {', '.join(parts)}." if parts else ""


def make_component(spec: FieldSpec, value: Any, elem_id: str | None = None) -> Any:
    """The component of one setting, showing ``value`` (a component value)."""
    import gradio as gr

    common = {"label": spec.label, "info": _info(spec), "elem_id": elem_id,
              "elem_classes": ["ks-field"]}
    if spec.path == "mode":  # the tab decides the mode; shown, not edited
        common["interactive"] = False
    if spec.kind == "bool":
        return gr.Checkbox(value=value, **common)
    if spec.kind == "choice":
        choices = [(str(c), c) for c in spec.choices]
        if spec.optional:
            choices.insert(0, (UNSET_LABEL, ""))
        return gr.Dropdown(choices=choices, value=value, filterable=False, **common)
    if spec.kind in ("int", "float") and spec.optional:
        # gr.Number cannot be empty (the page sends 0 for None), so unset-able numbers are text
        common["info"] += _range_words(spec.bounds)
        return gr.Textbox(value="" if value is None else str(value), max_lines=1,
                          placeholder="unset", **common)
    if spec.kind in ("int", "float"):
        b = spec.bounds
        step = b.get("multiple_of", 1) if spec.kind == "int" else None
        return gr.Number(value=value, minimum=b.get("ge", b.get("gt")),
                         maximum=b.get("le", b.get("lt")), precision=0 if spec.kind == "int"
                         else None, step=step or 1, **common)
    if spec.kind == "list" or spec.widget == "textarea":
        return gr.Textbox(value=value, lines=3, max_lines=12, **common)
    if spec.kind == "dict":
        return gr.Textbox(value=value, lines=2, max_lines=12,
                          placeholder="d_coef = 2.0", **common)
    placeholder = "a folder or file path" if spec.widget in ("dir", "file") else None
    return gr.Textbox(value=value, lines=1, max_lines=1, placeholder=placeholder, **common)


def _grid(form: Form, specs: list[FieldSpec], values: Mapping[str, Any], per_row: int) -> None:
    import gradio as gr

    for start in range(0, len(specs), per_row):
        with gr.Row(equal_height=False, elem_classes=["ks-row"]):  # app.CSS hides it empty
            for spec in specs[start:start + per_row]:
                elem_id = f"{form.mode}-{spec.path.replace('.', '-')}"
                form.components[spec.path] = make_component(spec, values[spec.path], elem_id)


def build_form(form: Form, sections: list[str], per_row: int = 3,
               titles: Mapping[str, str] | None = None,
               initial: TrainConfig | None = None) -> Form:
    """Lay the form out in the current Blocks: one open accordion per section (in ``sections``
    order, then any other; ``titles`` renames some), its advanced fields in a closed inner
    "Advanced" accordion. The form shows ``initial``, else the schema's defaults."""
    import gradio as gr

    titles = {**SECTION_TITLES, **(titles or {})}
    values = form.values(initial) if initial is not None else form.defaults()
    present = list(dict.fromkeys(s.section for s in form.specs.values()))
    order = [s for s in sections if s in present] + [s for s in present if s not in sections]
    for section in order:
        specs = [s for s in form.specs.values() if s.section == section]
        if not specs:
            continue
        basic = [s for s in specs if not s.advanced]
        advanced = [s for s in specs if s.advanced]
        with gr.Accordion(titles.get(section, section.title()), open=True,
                          elem_id=f"{form.mode}-section-{section or 'mode'}") as outer:
            _grid(form, basic, values, per_row)
            inner = None
            if advanced:
                with gr.Accordion("Advanced", open=False,
                                  elem_id=f"{form.mode}-advanced-{section or 'mode'}") as inner:
                    _grid(form, advanced, values, per_row)
            extra = form.section_extras.get(section)
            if extra is not None:
                extra()
        form.accordions[section] = (outer, inner)
    return form


# --- search ----------------------------------------------------------------------------------

def search(specs: list[FieldSpec], query: str) -> set[str]:
    """The paths of the fields whose label, key, dotted path or help hold every word of
    ``query`` (case does not matter); every field for an empty query."""
    words = query.lower().split()
    found = set()
    for spec in specs:
        text = " ".join((spec.label, spec.name, spec.path, spec.help)).lower()
        if all(word in text for word in words):
            found.add(spec.path)
    return found


def search_updates(form: Form, query: str) -> dict[Any, Any]:
    """Show the fields that match ``query`` and only those; open the sections and "Advanced"
    parts that hold a match. An empty query puts the form back as it was built."""
    import gradio as gr

    found = search(list(form.specs.values()), query)
    out: dict[Any, Any] = {comp: gr.update(visible=path in found)
                           for path, comp in form.components.items()}
    searching = bool(query.strip())
    for section, (outer, inner) in form.accordions.items():
        specs = [s for s in form.specs.values() if s.section == section]
        hits = [s for s in specs if s.path in found]
        out[outer] = gr.Accordion(visible=bool(hits) or not searching, open=True)
        if inner is not None:
            out[inner] = gr.Accordion(open=searching and any(s.advanced for s in hits))
    return out
