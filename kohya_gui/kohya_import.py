"""The "Load kohya_ss config" control of each mode tab: a kohya_ss GUI JSON file (or one of its
presets) fills the form through trainer.importers.kohya, and the import report (what was
imported, what is not supported and why) is shown under the file row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from kohya_gui.fields import Form
from kohya_gui.safe_text import md, md_lines
from trainer.config import files as config_io
from trainer.importers.kohya import detect_mode, import_kohya, read_json

TAB_TITLES = {"lora": "LoRA", "dreambooth": "DreamBooth", "textual_inversion": "Textual Inversion"}


def upload_button(mode: str) -> Any:
    return gr.UploadButton("Load kohya_ss config", file_types=[".json"], file_count="single",
                           type="filepath", size="sm", scale=0, min_width=150,
                           elem_id=f"{mode}-load-kohya")


def _problems(exc: config_io.ConfigError, intro: str) -> str:
    return f"**{intro}**\n" + md_lines(exc.problems)


def load_kohya_config(form: Form, path: Any) -> tuple[dict[str, Any] | None, str]:
    """(form values, report markdown) for an uploaded kohya_ss JSON; a file made for another
    tab or refused by the importer leaves the form as it is and says why."""
    path = getattr(path, "name", path)  # gradio may hand a file object or its path
    if not path:
        return None, "**Choose a kohya_ss .json config to load.**"
    shown = Path(str(path)).name
    try:
        data = read_json(path)
        detected, _ = detect_mode(data)
        if detected is not None and detected != form.mode:
            raise config_io.ConfigError(
                [f"this is a kohya_ss {detected} config: load it in the "
                 f"{TAB_TITLES[detected]} tab"], shown)
        cfg, report = import_kohya(data, form.mode, shown)
    except config_io.ConfigError as exc:
        return None, _problems(exc, "The kohya_ss config cannot be loaded:")
    return form.values(cfg), report_markdown(report)


def report_markdown(report: Any) -> str:
    """The import report with every key and value of the file shown as text (a stranger's file
    can hold markup in its keys and values)."""
    out = [f"**Imported {md(report.source)} as a {report.mode} config.**"]
    for head, body in report.lines():
        out += ["", f"**{head}:**", md_lines(body, 500)]
    return "\n".join(out)
