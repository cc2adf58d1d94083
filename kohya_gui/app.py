"""The Blocks app: a device banner, one tab per mode plus Utilities, the Training panel, and
the launch settings (no monitoring endpoint, no analytics, temporary files in the data folder,
only the output folders served).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainer import paths
from trainer.config import TrainConfig

log = logging.getLogger(__name__)

TITLE = "Kohya Studio"
CSS = """
.ks-log { max-height: 300px; overflow-y: auto; font-family: monospace; font-size: 0.8em;
          white-space: pre-wrap; padding: 6px; border: 1px solid var(--border-color-primary);
          border-radius: 4px; min-height: 120px; }
.ks-line:first-child { font-weight: bold; }
.ks-status { font-size: 1.1em; font-weight: bold; margin-bottom: 4px; }
.ks-preparing { margin-bottom: 4px; }
.ks-failed { color: var(--error-text-color, #c00); }
.ks-bar { width: 85%; height: 14px; vertical-align: middle; }
.ks-pct { margin-left: 8px; }
.ks-cells { display: flex; flex-wrap: wrap; gap: 14px; margin-top: 4px; }
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
    from trainer import device

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
    """The whole page. ``runner`` defaults to one running ``trainer.loop.run``."""
    configure_environment()
    import gradio as gr

    from kohya_gui.panel import build_panel
    from kohya_gui.runner import Runner
    from kohya_gui.tabs import dreambooth, lora, textual_inversion, utilities

    info, banner = detect_device()
    runner = runner or Runner(device_info=info)
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"# {TITLE}\n{banner}", elem_id="device-banner")
        with gr.Tabs():
            with gr.Tab("LoRA", id="lora"):
                lora.build(runner)
            with gr.Tab("DreamBooth", id="dreambooth"):
                dreambooth.build(runner)
            with gr.Tab("Textual Inversion", id="textual_inversion"):
                textual_inversion.build(runner)
            with gr.Tab("Utilities", id="utilities"):
                utilities.build()
        panel = build_panel(runner)
        panel["load"](demo)
        _api(demo, runner)
    runner.on_start = lambda job: allow_path(demo, job.cfg.saving.output_dir)
    demo.runner = runner
    return demo


def _api(demo: Any, runner: Any) -> None:
    """Endpoints for scripts (gradio_client): they go through the same validation as the form."""
    import gradio as gr

    from kohya_gui.api import api_functions

    for name, fn in api_functions(runner).items():
        gr.api(fn, api_name=name, concurrency_limit=None)


def launch(demo: Any, *, listen: str = "127.0.0.1", port: int | None = 7860,
           auth: tuple[str, str] | None = None, inbrowser: bool = False,
           prevent_thread_lock: bool = False, quiet: bool = False) -> Any:
    """Start the server with the studio's settings; returns gradio's (app, url, share url)."""
    configure_environment()
    return demo.launch(
        server_name=listen, server_port=port, auth=auth, inbrowser=inbrowser, share=False,
        prevent_thread_lock=prevent_thread_lock, quiet=quiet,
        enable_monitoring=False, allowed_paths=[default_output_dir()],
        max_file_size="1mb", ssr_mode=False, mcp_server=False, run_history=False,
        footer_links=["api", "settings"], show_error=True, css=CSS,
        auth_message="Log in to Kohya Studio" if auth else None,
    )
