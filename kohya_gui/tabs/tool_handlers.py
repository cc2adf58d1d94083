"""What the Utilities tab's buttons do, as plain functions of ``{option name: value}``.

Each handler validates through the tool's options (the command line's path), runs the tool and
returns what the page shows: the same report text the CLI prints (Markdown), and tables for the
plots. Bad options come back as a list of problems naming each option; a tool that cannot do
its job says why. The tests call these functions directly, with the values a form sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pandas as pd

from kohya_gui.safe_text import clean_metadata, code_block, md, md_lines
from kohya_gui.tabs.tool_forms import raw_values
from trainer.tools import options as o
from trainer.tools.common import Progress, ToolError, no_progress

log = logging.getLogger(__name__)
NORM_COLUMNS = ["module", "norm", "part"]
RESIZE_COLUMNS = ["module", "rank", "alpha", "fro kept %", "sum kept %"]
EDITOR_COLUMNS = ["thumbnail", "image", "caption"]
PAIR_COLUMNS = ["thumbnail", "controls", "image", "caption"]  # with a control folder
TAG_COLUMNS = ["tag", "count"]


def problems_markdown(problems: list[str]) -> str:
    return "**Problems:**\n" + md_lines(problems)


def run_tool(model: type[o.ToolOptions], values: dict[str, Any],
             run: Callable[[Any], Any]) -> tuple[Any, str]:
    """(report, "") or (None, the message that says what went wrong)."""
    try:
        opts = o.validate(model, raw_values(model, values))
    except o.OptionsError as exc:
        return None, problems_markdown(exc.problems)
    try:
        return run(opts), ""
    except ToolError as exc:
        return None, f"**Error:** {md(exc, 2_000)}"
    except Exception as exc:  # noqa: BLE001 - the page says what broke; the log has the rest
        log.exception("tool %s failed", model.__name__)
        return None, f"**Failed:** {type(exc).__name__}: {md(exc, 2_000)}"


def gradio_progress(progress: Any) -> Progress:
    """The tools' ``(done, total, what)`` callback on a ``gr.Progress``."""
    def update(done: int, total: int, what: str) -> None:
        progress((done, max(total, 1)), desc=what)
    return update


def code(text: str) -> str:
    return code_block(text)


def short_name(name: str) -> str:
    for prefix in ("lora_unet_", "lora_te1_", "lora_te2_", "lora_te_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def inspect_tool(values: dict[str, Any]) -> tuple[str, pd.DataFrame, dict[str, str]]:
    """(report, update norms per module for the bar chart, raw metadata)."""
    from trainer.tools.inspect import PART_NAMES, format_inspect, inspect

    report, message = run_tool(o.InspectOptions, values, inspect)
    if report is None:
        return message, pd.DataFrame(columns=NORM_COLUMNS), {}
    frame = pd.DataFrame([(short_name(m.name), m.norm, PART_NAMES[m.part])
                          for m in report.modules], columns=NORM_COLUMNS)
    return format_inspect(report, escape=md), frame, clean_metadata(report.metadata)


def merge_tool(values: dict[str, Any], progress: Progress = no_progress) -> str:
    from trainer.tools.merge import format_merge, merge

    report, message = run_tool(o.MergeOptions, values, lambda opts: merge(opts, progress))
    return message or code(format_merge(report))


def resize_tool(values: dict[str, Any], progress: Progress = no_progress
                ) -> tuple[str, pd.DataFrame]:
    from trainer.tools.resize import resize

    report, message = run_tool(o.ResizeOptions, values, lambda opts: resize(opts, progress))
    if report is None:
        return message, pd.DataFrame(columns=RESIZE_COLUMNS)
    rows = [(short_name(m.name), f"{m.old_rank} -> {m.new_rank}", round(m.alpha, 4),
             round(100 * m.fro_kept, 2), round(100 * m.sum_kept, 2)) for m in report.modules]
    kept = [m.fro_kept for m in report.modules]
    text = (f"Wrote **{md(report.save_to)}** in {report.seconds:.1f} s: network dim {report.dim}, "
            f"alpha {report.alpha}; Frobenius norm kept: mean {report.mean_fro_kept:.1%}, "
            f"lowest {min(kept):.1%}")
    return text, pd.DataFrame(rows, columns=RESIZE_COLUMNS)


def extract_tool(values: dict[str, Any], progress: Progress = no_progress) -> str:
    from trainer.tools.extract import extract, format_extract

    report, message = run_tool(o.ExtractOptions, values, lambda opts: extract(opts, progress))
    return message or code(format_extract(report))


def caption_tool(values: dict[str, Any], progress: Progress = no_progress) -> str:
    from trainer.tools.caption import caption_with_model, format_caption

    report, message = run_tool(o.CaptionOptions, values,
                               lambda opts: caption_with_model(opts, progress))
    return message or code(format_caption(report))


def tag_tool(values: dict[str, Any], progress: Progress = no_progress) -> str:
    from trainer.tools.caption import format_caption, tag_with_tagger

    report, message = run_tool(o.TagOptions, values,
                               lambda opts: tag_with_tagger(opts, progress))
    return message or code(format_caption(report))


# --- the caption editor ----------------------------------------------------------------------


def tags_frame(captions: list[str]) -> pd.DataFrame:
    from trainer.tools.caption_table import tag_counts

    return pd.DataFrame(tag_counts(captions), columns=TAG_COLUMNS)


def _thumb(path: Any, name: str) -> str:
    from trainer.tools.caption_table import thumbnail_uri

    return f"![{md(name, 80)}]({thumbnail_uri(path)})"


def load_editor(folder: str, extension: str, recursive: bool, control_dir: str = ""
                ) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(rows: thumbnail, image, caption, and with ``control_dir`` (edit training's instruction
    captions) the controls of each image beside it; tag counts; a message)."""
    from pathlib import Path

    from trainer.tools.caption_table import image_controls, read_rows

    columns = PAIR_COLUMNS if (control_dir or "").strip() else EDITOR_COLUMNS
    empty = pd.DataFrame(columns=columns)
    controls: list[Any] = []
    orphans: list[Any] = []
    try:
        rows = read_rows(folder, extension or ".txt", recursive)
        if columns is PAIR_COLUMNS:
            controls, orphans = image_controls(folder, [n for n, _ in rows], control_dir.strip())
    except ToolError as exc:
        return empty, tags_frame([]), f"**Error:** {md(exc, 2_000)}"
    root = Path(folder).expanduser()
    missing = sum(1 for _, caption in rows if not caption)
    message = f"{len(rows)} images, {missing} without a caption"
    if columns is PAIR_COLUMNS:
        frame = pd.DataFrame([(_thumb(root / name, name),
                               " ".join(_thumb(p, p.name) for p in found), name, caption)
                              for (name, caption), found in zip(rows, controls)],
                             columns=columns)
        message += (f"; {sum(1 for f in controls if f)} with control images, "
                    f"{len(orphans)} control image(s) matching no image")
    else:
        frame = pd.DataFrame([(_thumb(root / name, name), name, caption)
                              for name, caption in rows], columns=columns)
    return frame, tags_frame([c for _, c in rows]), message


def editor_table(frame: pd.DataFrame) -> Any:
    """The editor's table for ``frame``: thumbnails as images, only the caption editable."""
    import gradio as gr

    markdown = len(frame.columns) - 2  # the thumbnail columns, before image and caption
    return gr.Dataframe(value=frame, headers=list(frame.columns),
                        datatype=["markdown"] * markdown + ["str", "str"],
                        static_columns=list(range(len(frame.columns) - 1)))


def save_editor(folder: str, extension: str, frame: Any) -> tuple[str, pd.DataFrame]:
    from trainer.tools.caption_table import save_rows

    if isinstance(frame, pd.DataFrame):
        data = frame
    else:
        wide = bool(frame) and len(frame[0]) == len(PAIR_COLUMNS)
        data = pd.DataFrame(frame, columns=PAIR_COLUMNS if wide else EDITOR_COLUMNS)
    rows = [(str(r["image"]), str(r["caption"] or "")) for _, r in data.iterrows()
            if str(r["image"] or "").strip()]
    try:
        changed = save_rows(folder, rows, extension or ".txt")
    except ToolError as exc:
        return f"**Error:** {md(exc, 2_000)}", tags_frame([c for _, c in rows])
    return f"Saved {changed} changed caption(s).", tags_frame([c for _, c in rows])
