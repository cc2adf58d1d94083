"""Which model family the form's base model is, and the form's fields for that family only.

A setting whose UI hints name ``families`` (``setting(..., families=(...))`` in the schema: the
[flow] section, ``model.ae`` / ``clip_l`` / ``clip_g`` / ``t5xxl``, ``network.train_blocks``...)
is read only by models of those families, so the tab shows it only when the base model is one
of them, and hides a section (or its "Advanced" part) that is left with nothing to show. The
family comes from, first match:

- ``model.model_version`` when it is not ``auto``, and the embedded models (the config's own
  rule, ``trainer.config.rules.family.known_family``);
- a diffusers folder or a ``.safetensors`` file: the loader's own detection
  (``trainer.families.detect_path``: ``model_index.json``, or the header's key names and
  shapes), which reads no weight and imports no torch.

Anything else (a path that does not exist yet, a ``.ckpt``, a file detection cannot place) is
unknown, and an unknown family shows every field: hiding a setting the model may read would be
worse than showing one it ignores. A field whose value differs from its default stays visible
whatever the family, so that a loaded config that sets it (and that the rules then refuse,
naming it) can still be fixed in the form.

The visibility is worked out again when the model field or the family field changes (typing,
a preset, a config file, a kohya_ss import all change them) and when the search box changes,
so searching never brings back a field of another family.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, Optional

from kohya_gui.fields import Form, search, to_widget
from trainer.config import iter_fields, ui_hints
from trainer.config.rules.family import known_family

MODEL_PATH = "model.pretrained_model_name_or_path"
MODEL_VERSION = "model.model_version"


def field_families() -> dict[str, tuple[str, ...]]:
    """``{dotted path: families}`` of every setting whose UI hints name families."""
    out = {}
    for section, name, info in iter_fields():
        families = ui_hints(info).get("families")
        if families is not None:  # empty: no family reads it yet (dataset.control_dir)
            out[f"{section}.{name}" if section else name] = tuple(families)
    return out


FIELD_FAMILIES = field_families()


# --- the family of the form's model ----------------------------------------------------------

def model_family(model: Any, version: Any = "auto") -> Optional[str]:
    """The family of the form's base model (``model`` and ``model_version`` as the form holds
    them); None when it cannot be told, which shows every family's fields."""
    model = str(model or "").strip()
    version = str(version or "auto")
    named = known_family(SimpleNamespace(model=SimpleNamespace(
        model_version=version, pretrained_model_name_or_path=model)))
    if named is not None or not model or model.startswith("embedded:"):
        return named
    from trainer.families import family_or_none

    return family_or_none(model)  # the loader's own detection, headers only


# --- what the form shows ---------------------------------------------------------------------

def applies(path: str, family: Optional[str]) -> bool:
    """Whether a setting is read by a model of ``family`` (None: unknown, so yes)."""
    families = FIELD_FAMILIES.get(path)
    return family is None or families is None or family in families


def changed_paths(form: Form, values: Mapping[str, Any]) -> set[str]:
    """The paths whose component value differs from the default's (kept in view)."""
    out = set()
    for path, value in values.items():
        spec = form.specs.get(path)
        if spec is not None and path in FIELD_FAMILIES and value != to_widget(spec, spec.default):
            out.add(path)
    return out


def shown_paths(form: Form, family: Optional[str], query: str = "",
                keep: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """The fields in view: those matching ``query`` and read by ``family``, and ``keep``."""
    found = search(list(form.specs.values()), query)
    return {p for p in found if applies(p, family) or p in keep}


def view_updates(form: Form, family: Optional[str], query: str = "",
                 keep: frozenset[str] | set[str] = frozenset()) -> dict[Any, Any]:
    """Gradio updates showing the fields of ``family`` that match ``query``: sections and
    "Advanced" parts with nothing left in view are hidden; a search opens those with hits."""
    import gradio as gr

    shown = shown_paths(form, family, query, keep)
    out: dict[Any, Any] = {comp: gr.update(visible=path in shown)
                           for path, comp in form.components.items()}
    searching = bool(query.strip())
    for section, (outer, inner) in form.accordions.items():
        specs = [s for s in form.specs.values() if s.section == section and s.path in shown]
        out[outer] = gr.Accordion(visible=bool(specs), open=True)
        if inner is not None:
            advanced = any(s.advanced for s in specs)
            out[inner] = gr.Accordion(visible=advanced, open=searching and advanced)
    return out


def hide_initially(form: Form, family: Optional[str]) -> None:
    """Set the built form's visibility for ``family`` before the page is first drawn."""
    shown = shown_paths(form, family)
    for path, comp in form.components.items():
        comp.visible = path in shown
    for section, (outer, inner) in form.accordions.items():
        specs = [s for s in form.specs.values() if s.section == section and s.path in shown]
        outer.visible = bool(specs)
        if inner is not None:
            inner.visible = any(s.advanced for s in specs)


def form_updates(form: Form, values: Mapping[str, Any], query: str = "") -> dict[Any, Any]:
    """The updates for a form holding ``values`` (``{path: component value}``)."""
    family = model_family(values.get(MODEL_PATH), values.get(MODEL_VERSION, "auto"))
    return view_updates(form, family, query, changed_paths(form, values))


def wire(form: Form, search_box: Any) -> None:
    """Recompute the view when the model, its family or the search text changes (in the
    current Blocks; after the form is built)."""
    outputs = list(form.components.values()) + [
        a for pair in form.accordions.values() for a in pair if a is not None]

    def update(data: dict[Any, Any]) -> dict[Any, Any]:
        return form_updates(form, form.by_path(data), str(data.get(search_box) or ""))

    triggers = [search_box] + [form.components[p] for p in (MODEL_PATH, MODEL_VERSION)
                               if p in form.components]
    for trigger in triggers:
        trigger.change(update, form.inputs | {search_box}, outputs, trigger_mode="always_last",
                       show_progress="hidden", api_visibility="private", preprocess=False)
