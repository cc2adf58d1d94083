"""The advisor under Train: memory, time and advice for the form as it stands.

A summary line (the estimated peak memory of the device's, time per step and for the run), the
whole report in a closed accordion (steps, the memory table, with and without gradient
checkpointing, the time) and up to :data:`SLOTS` buttons, one per recommendation that a setting
can apply; a click puts its values into the form, which refreshes the advice. The estimate is
``trainer.advisor.estimate.advise`` on the form's config (the same validation as Train); the
handlers are plain functions of ``{path: value}`` so the tests call them without a browser.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from kohya_gui.fields import Form, to_widget
from trainer.config import files as config_io

SLOTS = 3


def advice_for(form: Form, values: dict[str, Any], info: Any = None
               ) -> tuple[str, str, list[dict[str, Any]]]:
    """(summary markdown, report markdown, the applicable recommendations as
    ``{"title", "changes"}``) for the form's values."""
    from trainer.advisor.estimate import advise
    from trainer.advisor.report import advice_markdown, summary

    try:
        cfg = form.config(values)
    except config_io.ConfigError as exc:
        return ("_No estimate until these settings are fixed:_ "
                + "; ".join(f"`{p}`" for p in exc.problems)), "", []
    advice = advise(cfg, info)
    usable = [{"title": r.title, "changes": {k: v for k, v in r.changes.items()
                                             if k in form.specs}}
              for r in advice.recommendations if r.changes and not r.done]
    usable = [u for u in usable if u["changes"]][:SLOTS]
    return summary(advice), advice_markdown(advice, cfg), usable


def applied(form: Form, changes: dict[str, Any]) -> dict[str, Any]:
    """``{path: component value}`` that puts ``changes`` (config values) into the form."""
    return {path: to_widget(form.specs[path], value) for path, value in changes.items()
            if path in form.specs}


def build(mode: str) -> dict[str, Any]:
    """The advisor's components, in the current Blocks."""
    parts: dict[str, Any] = {
        "summary": gr.Markdown("_Estimating memory and time..._",
                               elem_id=f"{mode}-advisor-summary", elem_classes=["ks-advice"]),
        "state": gr.State([]),
    }
    with gr.Row(equal_height=True, elem_classes=["ks-apply"]):
        parts["apply"] = [gr.Button(visible=False, size="sm", elem_id=f"{mode}-apply-{i}")
                          for i in range(SLOTS)]
    with gr.Accordion("Estimate and advice", open=False, elem_id=f"{mode}-advisor-details"):
        parts["details"] = gr.Markdown(elem_id=f"{mode}-advisor")
    return parts


def wire(form: Form, parts: dict[str, Any], info: Any = None) -> Any:
    """Refresh on every change of the form (the last one of a burst wins); the apply buttons.
    Returns the refresh function, for the page's load event."""
    outputs = [parts["summary"], parts["details"], parts["state"], *parts["apply"]]

    def refresh(data: dict[Any, Any]) -> list[Any]:
        short, report, usable = advice_for(form, form.by_path(data), info)
        buttons = [gr.Button(f"Apply: {u['title']}", visible=True) for u in usable]
        buttons += [gr.Button(visible=False)] * (SLOTS - len(usable))
        return [short, report, usable, *buttons]

    common = {"show_progress": "hidden", "api_visibility": "private", "preprocess": False}
    gr.on([c.change for c in form.components.values()], refresh, form.inputs, outputs,
          trigger_mode="always_last", **common)
    form_outputs = list(form.components.values())
    for slot, button in enumerate(parts["apply"]):
        def apply(usable: list[dict[str, Any]], slot: int = slot) -> dict[Any, Any]:
            if slot >= len(usable):  # (an empty dict would read as one value)
                return {form_outputs[0]: gr.skip()}
            values = applied(form, usable[slot]["changes"])
            return {form.components[path]: value for path, value in values.items()}
        button.click(apply, parts["state"], form_outputs, api_visibility="private")
    return refresh, outputs
