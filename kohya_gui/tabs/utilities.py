"""The Utilities tab: the toolbox (inspect, merge, resize, extract, caption, caption editor), the
environment report (``trainer.tools.doctor``) and a config-file check.

Each tool's form is generated from its options (:mod:`kohya_gui.tabs.tool_forms`) and its button
calls a plain handler (:mod:`kohya_gui.tabs.tool_handlers`) with ``{option: value}``; the report
is the one the CLI prints. The tools that load models run one at a time (one concurrency
group), with gradio's progress bar.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import gradio as gr

from kohya_gui.safe_text import md, md_lines
from kohya_gui.tabs import tool_handlers as h
from kohya_gui.tabs.tool_forms import ToolForm, build_form, form_values, make_component
from trainer.config import files as config_io
from trainer.tools import options as o

TOOLS_GROUP = "utilities-tools"


def doctor_report() -> str:
    """What ``python -m trainer.tools.doctor`` prints, captured."""
    from trainer.tools import doctor

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = doctor.main([])
        except SystemExit as exc:  # a CLI main may exit instead of returning
            code = exc.code
        except Exception as exc:  # noqa: BLE001 - the report says what broke
            print(f"the environment check crashed: {exc}")
            code = 1
    status = "no problems found" if code in (0, None) else f"exit status {code}"
    return out.getvalue().rstrip() + f"\n\n[{status}]"


def check_config_file(path: str) -> str:
    path = (path or "").strip()
    if not path:
        return "**Enter the path of a config file.**"
    try:
        cfg = config_io.load(path)
    except config_io.ConfigError as exc:
        return "**Problems:**\n" + md_lines(exc.problems)
    return f"{md(path)} is a valid **{cfg.mode}** config."


def bind(button: Any, form: ToolForm, handler: Callable[..., Any], outputs: list[Any],
         api_name: str, progress: bool = True) -> None:
    """``button`` runs ``handler(values[, progress])`` on the form's values."""
    if progress:
        def run(data: dict[Any, Any], progress=gr.Progress()):
            return handler(form_values(form, data), h.gradio_progress(progress))
    else:
        def run(data: dict[Any, Any]):
            return handler(form_values(form, data))
    button.click(run, form.inputs, outputs, api_name=api_name, concurrency_limit=1,
                 concurrency_id=TOOLS_GROUP)


def _inspect_section() -> None:
    with gr.Accordion("Inspect a LoRA, LyCORIS or embedding file", open=True):
        form = build_form("inspect", o.InspectOptions, [["path", "top_tags"]],
                          {"path": {"scale": 4}})
        run = gr.Button("Inspect", size="sm", elem_id="inspect-run")
        report = gr.Markdown(elem_id="inspect-report")
        norms = gr.BarPlot(x="module", y="norm", color="part", elem_id="inspect-norms",
                           label="Update norm per module (Frobenius)", height=260,
                           x_axis_labels_visible=False, tooltip="all")
        with gr.Accordion("All metadata", open=False):
            metadata = gr.JSON(elem_id="inspect-metadata")
        bind(run, form, h.inspect_tool, [report, norms, metadata], "inspect_lora",
             progress=False)


def _merge_section() -> None:
    with gr.Accordion("Merge LoRAs into a model", open=False):
        gr.Markdown("Adds each LoRA's update (times its weight) to the base model's layers and "
                    "saves the result as one checkpoint in the original layout and/or a "
                    "diffusers folder.")
        form = build_form("merge", o.MergeOptions, [["base", "config_dir"],
                                                    ["loras", "weights"],
                                                    ["save_to", "save_folder", "precision"]])
        run = gr.Button("Merge", size="sm", elem_id="merge-run")
        bind(run, form, h.merge_tool, [gr.Markdown(elem_id="merge-report")], "merge_loras")


def _resize_section() -> None:
    with gr.Accordion("Resize a LoRA", open=False):
        gr.Markdown("Lowers the rank by SVD, to a fixed rank or per module by the energy "
                    "kept (sv_ratio, sv_fro, sv_cumulative, as sd-scripts offers them).")
        form = build_form("resize", o.ResizeOptions, [
            ["path", "save_to"], ["rank", "conv_rank", "precision"],
            ["dynamic_method", "dynamic_param"]])
        run = gr.Button("Resize", size="sm", elem_id="resize-run")
        report = gr.Markdown(elem_id="resize-report")
        table = gr.Dataframe(headers=h.RESIZE_COLUMNS, interactive=False, max_height=300,
                             elem_id="resize-table", label="Energy kept per module")
        bind(run, form, h.resize_tool, [report, table], "resize_lora")


def _extract_section() -> None:
    with gr.Accordion("Extract a LoRA from a fine-tuned model", open=False):
        gr.Markdown("The SVD of the difference between a fine-tuned model (e.g. a DreamBooth "
                    "output) and its base, as a kohya LoRA.")
        form = build_form("extract", o.ExtractOptions, [
            ["base", "tuned"], ["save_to", "config_dir"],
            ["rank", "conv_rank", "precision"], ["min_diff", "clamp_quantile"]])
        run = gr.Button("Extract", size="sm", elem_id="extract-run")
        bind(run, form, h.extract_tool, [gr.Markdown(elem_id="extract-report")],
             "extract_lora")


def _caption_section() -> None:
    with gr.Accordion("Caption a folder", open=False):
        gr.Markdown("With a local image-to-text model folder (BLIP, GIT, ... through "
                    "transformers) or a WD14-style tagger folder (model.onnx and "
                    "selected_tags.csv, through onnxruntime). See the README for where to get "
                    "them.")
        common = build_form("caption", o.CaptionFolderOptions, [
            ["folder", "model_dir"], ["prefix", "suffix", "caption_extension"],
            ["overwrite", "recursive", "batch_size"]])
        with gr.Accordion("Image-to-text model", open=True):
            model = build_form("caption", o.CaptionOptions, [["max_new_tokens", "num_beams"]])
            run_model = gr.Button("Caption with the model", size="sm", elem_id="caption-run")
        with gr.Accordion("WD14 tagger", open=True):
            tagger = build_form("tag", o.TagOptions, [
                ["general_threshold", "character_threshold", "exclude_tags"],
                ["underscores_to_spaces", "character_tags_first", "rating"]])
            run_tagger = gr.Button("Tag with the tagger", size="sm", elem_id="tag-run")
        report = gr.Markdown(elem_id="caption-report")
        for button, specific, handler, api in ((run_model, model, h.caption_tool, "caption"),
                                               (run_tagger, tagger, h.tag_tool, "tag")):
            form = ToolForm(specific.tool, specific.model, {**common.fields, **specific.fields})
            bind(button, form, handler, [report], api)


def _editor_section() -> None:
    with gr.Accordion("Caption editor", open=False):
        with gr.Row():
            folder = make_component("editor", o.CaptionEditorOptions, "folder", scale=4)
            extension = make_component("editor", o.CaptionEditorOptions, "caption_extension")
            recursive = make_component("editor", o.CaptionEditorOptions, "recursive")
        control_dir = make_component("editor", o.CaptionEditorOptions, "control_dir")
        load = gr.Button("Load captions", size="sm", elem_id="editor-load")
        message = gr.Markdown(elem_id="editor-message")
        with gr.Row():
            table = gr.Dataframe(headers=h.EDITOR_COLUMNS, datatype=["markdown", "str", "str"],
                                 static_columns=[0, 1], interactive=True, wrap=True, scale=3,
                                 max_height=600, elem_id="editor-table",
                                 label="Captions (edit the last column)")
            tags = gr.Dataframe(headers=h.TAG_COLUMNS, interactive=False, max_height=600,
                                scale=1, elem_id="editor-tags", label="Tag frequency")
        save = gr.Button("Save captions", size="sm", elem_id="editor-save")
        def load_table(*values: Any) -> tuple[Any, Any, str]:
            frame, tag_frame, text = h.load_editor(*values)
            return h.editor_table(frame), tag_frame, text

        load.click(load_table, [folder, extension, recursive, control_dir],
                   [table, tags, message], api_name="load_captions")
        save.click(h.save_editor, [folder, extension, table], [message, tags],
                   api_name="save_captions")


def build() -> None:
    _inspect_section()
    _merge_section()
    _resize_section()
    _extract_section()
    _caption_section()
    _editor_section()
    with gr.Accordion("Environment report", open=False):
        gr.Markdown("The torch build, the device it sees, a small computation on it, and known "
                    "mismatches (what `python -m trainer.tools.doctor` prints).")
        run = gr.Button("Run the environment check", size="sm", elem_id="doctor-run")
        report = gr.Textbox(label="Report", lines=12, max_lines=40, elem_id="doctor-report")
        run.click(doctor_report, None, report, api_name="doctor")
    with gr.Accordion("Check a config file", open=False):
        path = gr.Textbox(label="Config file (.toml)", max_lines=1)
        check = gr.Button("Check", size="sm")
        result = gr.Markdown()
        check.click(check_config_file, path, result, api_name="check_config_file")
