"""The Blocks app: a device banner; the form (one tab per mode plus Utilities) on the left and,
on a wide screen, the Training panel on the right, which stays in view while the form scrolls
(Train, Stop, the advisor, progress, curve, log, samples); on a narrow screen (under 1000 px)
the panel comes above the form. And the launch settings (no monitoring endpoint, no analytics,
temporary files in the data folder, only the output folders served).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig, paths

log = logging.getLogger(__name__)

TITLE = "Kohya Studio"
CSS = """
.gradio-container { overflow: clip !important; }  /* hidden would stop the panel sticking */
#studio { align-items: flex-start; flex-wrap: nowrap; gap: 14px; }
#studio-side { position: sticky; top: 6px; max-height: calc(100vh - 64px); overflow-y: auto;
               align-self: flex-start; }
@media (max-width: 1000px) {
  #studio { flex-direction: column; flex-wrap: wrap; }
  #studio-side { position: static; max-height: none; order: -1; width: 100%; }
  #studio-form { width: 100%; }
}
#run-row button { min-height: 42px; }
.ks-small, .ks-small p { font-size: 0.85em; margin: 0; }
.ks-files { gap: 6px; }
.ks-field code { font-size: 0.85em; opacity: 0.8; }
.ks-advice p { margin: 2px 0; }
.ks-log { max-height: 170px; overflow-y: auto; font-family: monospace; font-size: 0.8em;
          white-space: pre-wrap; padding: 6px; border: 1px solid var(--border-color-primary);
          border-radius: 4px; min-height: 120px; }
.ks-line:first-child { font-weight: bold; }
.ks-status { font-size: 1.1em; font-weight: bold; margin-bottom: 4px; }
.ks-preparing { margin-bottom: 4px; }
.ks-failed { color: var(--error-text-color, #c00); }
.ks-bar { width: 85%; height: 14px; vertical-align: middle; }
.ks-pct { margin-left: 8px; }
.ks-cells { display: flex; flex-wrap: wrap; gap: 14px; margin-top: 4px; }
/* a form row whose fields are all hidden (by the search or the model's family) takes no room */
.ks-row:not(:has(.block)) { display: none !important; }
"""


def configure_environment() -> Path:
    """Analytics off and Gradio's temporary/upload folder inside the data folder. Call before
    the Blocks are built (gradio reads these at build and launch)."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    tmp = paths.data_home() / "gradio_tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["GRADIO_TEMP_DIR"] = str(tmp)
    os.environ.setdefault("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    return tmp


def default_output_dir() -> str:
    return str(Path(TrainConfig().saving.output_dir).expanduser().resolve())


def detect_device() -> tuple[Any, str]:
    """(DeviceInfo, banner markdown): what the trainer will run on, and in which precision."""
    from trainer.system import device

    info = device.detect()
    try:
        precision = device.resolve_precision("auto", info)
    except ValueError as exc:
        precision = f"none usable ({exc})"
    words = {"no": "fp32", "fp16": "fp16 mixed", "bf16": "bf16 mixed"}.get(precision, precision)
    mem = device.format_bytes(info.memory_bytes) if info.memory_bytes else "memory unknown"
    banner = (f"**Device:** {info.label} - {info.name} - {mem} - precision: **{words}** "
              f"(training.mixed_precision = auto)")
    return info, banner


def allow_path(demo: Any, folder: str | Path) -> None:
    """Let the app serve files from ``folder`` (a run's output folder) from now on."""
    folder = str(Path(folder).expanduser().resolve())
    allowed = getattr(demo, "allowed_paths", None)
    if isinstance(allowed, list) and folder not in allowed:
        allowed.append(folder)


def build_app(runner: Any = None) -> Any:
    """The whole page. ``runner`` defaults to one running ``trainer.run.loop.run``."""
    configure_environment()
    import gradio as gr

    from kohya_gui import history
    from kohya_gui.panel import build_panel
    from kohya_gui.runner import Runner
    from kohya_gui.tabs import dreambooth, lora, textual_inversion, utilities

    info, banner = detect_device()
    runner = runner or Runner(device_info=info, history_path=history.default_path())
    modes = {"lora": ("LoRA", lora), "dreambooth": ("DreamBooth", dreambooth),
             "textual_inversion": ("Textual Inversion", textual_inversion)}
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"## {TITLE}\n{banner}", elem_id="device-banner")
        with gr.Row(equal_height=False, elem_id="studio"):
            with gr.Column(scale=3, min_width=520, elem_id="studio-form"):
                with gr.Tabs(elem_id="mode-tabs"):
                    tabs, selects = {}, {}
                    for mode, (title, module) in modes.items():
                        with gr.Tab(title, id=mode) as selects[mode]:
                            tabs[mode] = module.build(runner, controls=False, info=info)
                    with gr.Tab("Utilities", id="utilities") as selects[None]:
                        utilities.build()
            with gr.Column(scale=2, min_width=380, elem_id="studio-side"):
                panel = build_panel(runner, tabs, info)
        _wire_page(demo, panel, tabs, selects)
        _api(demo, runner)
    runner.on_start = lambda job: allow_path(demo, job.cfg.saving.output_dir)
    demo.runner = runner
    return demo


def _wire_page(demo: Any, panel: dict[str, Any], tabs: dict[str, Any],
               selects: dict[Any, Any]) -> None:
    """Selecting a tab shows its mode's Train and advisor; a new page draws the run at once
    and estimates its forms."""
    from kohya_gui.panel import show_mode

    shown = [c for pair in panel["modes"].values() for c in pair]
    for mode, tab_component in selects.items():
        tab_component.select(lambda mode=mode: show_mode(panel, mode), None, shown,
                             api_visibility="private", show_progress="hidden")
    panel["load"](demo)
    for tab in tabs.values():
        refresh, outputs = tab.parts["refresh_advice"]
        demo.load(refresh, tab.form.inputs, outputs, preprocess=False, show_progress="hidden",
                  api_visibility="private")


def _api(demo: Any, runner: Any) -> None:
    """Endpoints for scripts (gradio_client): they go through the same validation as the form."""
    import gradio as gr

    from kohya_gui.api import api_functions

    for name, fn in api_functions(runner).items():
        gr.api(fn, api_name=name, concurrency_limit=None)


def launch(demo: Any, *, listen: str = "127.0.0.1", port: int | None = 7860,
           auth: tuple[str, str] | None = None, inbrowser: bool = False,
           prevent_thread_lock: bool = False, quiet: bool = False,
           allowed_hosts: tuple[str, ...] = ()) -> Any:
    """Start the server with the studio's settings; returns gradio's (app, url, share url).
    Every request passes :mod:`kohya_gui.guard` first (Host, Origin, login, failed logins)."""
    from kohya_gui import guard

    configure_environment()
    return demo.launch(
        app_kwargs={"middleware": [guard.middleware(listen, auth is not None, allowed_hosts)]},
        server_name=listen, server_port=port, auth=auth, inbrowser=inbrowser, share=False,
        prevent_thread_lock=prevent_thread_lock, quiet=quiet,
        enable_monitoring=False, allowed_paths=[default_output_dir()],
        max_file_size="1mb", ssr_mode=False, mcp_server=False, run_history=False,
        footer_links=["api", "settings"], show_error=True, css=CSS,
        auth_message="Log in to Kohya Studio" if auth else None,
    )
