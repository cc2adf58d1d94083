"""The Utilities tab: the environment report (``trainer.doctor``) and a config-file check."""

from __future__ import annotations

import contextlib
import io

import gradio as gr

from trainer import config_io


def doctor_report() -> str:
    """What ``python -m trainer.doctor`` prints, captured."""
    from trainer import doctor

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
        return "**Problems:**\n" + "\n".join(f"- `{p}`" for p in exc.problems)
    return f"`{path}` is a valid **{cfg.mode}** config."


def build() -> None:
    with gr.Accordion("Environment report", open=True):
        gr.Markdown("The torch build, the device it sees, a small computation on it, and known "
                    "mismatches (what `python -m trainer.doctor` prints).")
        run = gr.Button("Run the environment check", size="sm", elem_id="doctor-run")
        report = gr.Textbox(label="Report", lines=12, max_lines=40, elem_id="doctor-report")
        run.click(doctor_report, None, report, api_name="doctor")
    with gr.Accordion("Check a config file", open=True):
        path = gr.Textbox(label="Config file (.toml)", max_lines=1)
        check = gr.Button("Check", size="sm")
        result = gr.Markdown()
        check.click(check_config_file, path, result, api_name="check_config_file")
