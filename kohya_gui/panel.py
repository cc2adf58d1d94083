"""The Training panel beside the form: Train and Stop, each mode's advisor, the progress, the
loss curve (training, validation, and a finished run to compare with), the log, the newest
sample images, the output file and the queue.

Everything of the run is drawn from ``Runner.snapshot()`` by a ``gr.Timer`` tick (no generator
handler: a generator dies with its tab, the runner's state does not), so a reloaded page or a
second tab shows the same job. Each page remembers in a ``gr.State`` what it last drew and only
sends what changed. Train and the advisor belong to a mode: the panel holds one of each per mode
tab and shows those of the selected tab (:func:`show_mode`).
"""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from kohya_gui import curve_svg, progress, sample_gallery
from kohya_gui.runner import Runner
from kohya_gui.tabs import mode_tab

POLL_SECONDS = 1.0
QUEUE_HEADERS = ["job", "status", "what"]
NO_COMPARE = ("no other run", "")


def _plot_key(snap: dict[str, Any], compare: str | None) -> list[Any]:
    last = snap["loss"][-1][0] if snap["loss"] else 0  # the series are thinned: lengths stall
    return [snap.get("job_id"), last, len(snap["loss"]), len(snap.get("validation", [])),
            snap.get("total") or 0, compare or ""]


def _plot_update(snap: dict[str, Any], seen: dict[str, Any], new_seen: dict[str, Any],
                 compare: str | None) -> str | None:
    """The curve's SVG when it changed since this page's last tick, else None."""
    key = new_seen["plot"] = _plot_key(snap, compare)
    if key == seen.get("plot"):
        return None
    return curve_svg.loss_svg(snap, progress.compared_run(snap, compare))


def render(snap: dict[str, Any], seen: dict[str, Any], parts: dict[str, Any],
           compare: str | None = None) -> dict[Any, Any]:
    """The updates for one tick: only what changed since ``seen`` (this page's last tick);
    ``compare`` is the job id of a finished run drawn beside this one."""
    same_job = seen.get("job_id") == snap.get("job_id")
    plot_done = seen.get("plot") == _plot_key(snap, compare)
    if (snap["version"] == seen.get("version") and same_job and plot_done
            and snap["status"] != "running"):
        return {parts["seen"]: seen}  # nothing new (an empty dict would read as one value)
    out: dict[Any, Any] = {parts["progress"]: progress.progress_html(snap)}
    new_seen = {"version": snap["version"], "job_id": snap.get("job_id"),
                "queue": [q["job_id"] for q in snap["queue"]],
                "samples": len(snap["samples"]), "rows": progress.queue_rows(snap),
                "runs": progress.comparable_runs(snap)}
    if snap["version"] != seen.get("version") or not same_job:
        out[parts["log"]] = progress.log_html(snap)
        out[parts["output"]] = progress.result_text(snap)
        out[parts["error"]] = gr.Markdown(progress.error_markdown(snap),
                                          visible=snap["status"] == "failed")
    plot = _plot_update(snap, seen, new_seen, compare)
    if plot is not None:
        out[parts["plot"]] = plot
    if new_seen["runs"] != seen.get("runs"):
        runs = [tuple(r) for r in new_seen["runs"]]
        out[parts["compare"]] = gr.Dropdown(choices=[NO_COMPARE, *runs])
    if new_seen["rows"] != seen.get("rows"):
        out[parts["queue"]] = pd.DataFrame(new_seen["rows"], columns=QUEUE_HEADERS)
    new_seen["resumable"] = snap.get("resumable", [])
    if new_seen["resumable"] != seen.get("resumable"):
        out[parts["resume_choice"]] = gr.Dropdown(
            choices=[tuple(r) for r in new_seen["resumable"]],
            value=(new_seen["resumable"] or [[None, None]])[0][1])
    if new_seen["queue"] != seen.get("queue"):
        out[parts["cancel_choice"]] = gr.Dropdown(choices=new_seen["queue"],
                                                  value=(new_seen["queue"] or [None])[0])
    if not same_job or new_seen["samples"] != seen.get("samples"):
        images = sample_gallery.gallery_items(snap)  # inside the output folder only
        out[parts["gallery"]] = gr.Gallery(images, visible=bool(images))
    out[parts["seen"]] = new_seen
    return out


def build_panel(runner: Runner, tabs: dict[str, Any] | None = None,
                info: Any = None) -> dict[str, Any]:
    """Lay the panel out in the current Blocks, with Train and the advisor of each mode tab
    in ``tabs`` (the first one shown), and start polling the runner."""
    parts: dict[str, Any] = {"modes": {}}
    tabs = tabs or {}
    with gr.Column(elem_id="training-panel"):
        with gr.Row(equal_height=True, elem_id="run-row"):
            for i, tab in enumerate(tabs.values()):
                mode_tab.train_button(tab, visible=i == 0)
            parts["stop"] = gr.Button("Stop", variant="stop", elem_id="stop", scale=1,
                                      min_width=80)
        parts["stop_msg"] = gr.Markdown(elem_id="stop-msg", elem_classes=["ks-small"])
        for i, (mode, tab) in enumerate(tabs.items()):
            with gr.Column(visible=i == 0, elem_id=f"{mode}-controls") as column:
                mode_tab.build_controls(tab)
            parts["modes"][mode] = (tab.parts["train"], column)
            mode_tab.wire(tab, runner, info)
        _run_view(runner, parts)
    parts["seen"] = gr.State({})
    parts["timer"] = gr.Timer(POLL_SECONDS)
    _wire(runner, parts)
    return parts


def _run_view(runner: Runner, parts: dict[str, Any]) -> None:
    parts["progress"] = gr.HTML(progress.progress_html(runner.snapshot()), elem_id="progress")
    parts["error"] = gr.Markdown(visible=False, elem_id="train-error")
    # an SVG built on the server (kohya_gui/curve_svg.py): Gradio's LinePlot grew the page's
    # memory with every update in a long run
    parts["plot"] = gr.HTML(curve_svg.loss_svg({"loss": [], "smoothed": []}),
                            elem_id="loss-plot", padding=False)
    parts["compare"] = gr.Dropdown(choices=[NO_COMPARE], value="", label="Compare with",
                                   allow_custom_value=True, elem_id="compare",
                                   info="draw a finished run's curves beside this one")
    parts["log"] = gr.HTML(progress.log_html({}), label="Log (newest first)",
                           elem_id="log-tail", padding=False)
    parts["gallery"] = gr.Gallery(label="Sample images", columns=4, height=200, visible=False,
                                  elem_id="samples")
    parts["output"] = gr.Textbox(label="Output file", interactive=False, max_lines=1,
                                 elem_id="output-path")
    with gr.Accordion("Queue and past runs", open=True, elem_id="queue"):
        parts["queue"] = gr.Dataframe(pd.DataFrame([], columns=QUEUE_HEADERS),
                                      interactive=False, elem_id="queue-table", max_height=220)
        with gr.Row(equal_height=True):
            parts["cancel_choice"] = gr.Dropdown(choices=[], value=None, label="Queued job",
                                                 scale=3, elem_id="cancel-choice")
            parts["cancel"] = gr.Button("Cancel queued job", size="sm", scale=1,
                                        elem_id="cancel")
        parts["queue_msg"] = gr.Markdown(elem_id="queue-msg")
        with gr.Row(equal_height=True):
            parts["resume_choice"] = gr.Dropdown(
                choices=[], value=None, label="Past run with a saved state", scale=3,
                elem_id="resume-choice", info="kept across restarts of the studio")
            parts["resume"] = gr.Button("Resume", size="sm", scale=1, elem_id="resume")


def show_mode(parts: dict[str, Any], mode: str | None) -> dict[Any, Any]:
    """Train and the advisor of ``mode`` (None: a tab without training) and no other's."""
    out: dict[Any, Any] = {}
    for name, (button, column) in parts["modes"].items():
        out[button] = gr.Button(visible=name == mode)
        out[column] = gr.Column(visible=name == mode)
    return out


def _wire(runner: Runner, parts: dict[str, Any]) -> None:
    outputs = [parts[k] for k in ("progress", "log", "output", "error", "plot", "queue",
                                  "cancel_choice", "gallery", "compare", "resume_choice",
                                  "seen")]

    def tick(seen: dict[str, Any], compare: str | None) -> dict[Any, Any]:
        return render(runner.snapshot(), seen or {}, parts, compare or None)

    poll = {"concurrency_limit": None, "show_progress": "hidden", "api_visibility": "private"}
    inputs = [parts["seen"], parts["compare"]]
    parts["timer"].tick(tick, inputs, outputs, **poll)
    parts["compare"].input(tick, inputs, outputs, **poll)
    # On page load: draw at once instead of waiting for the timer's first tick.
    parts["load"] = lambda demo: demo.load(tick, inputs, outputs, **poll)
    parts["stop"].click(runner.stop, None, parts["stop_msg"], api_name="stop",
                        concurrency_limit=None)
    parts["resume"].click(runner.resume, parts["resume_choice"], parts["queue_msg"],
                          api_name="resume", concurrency_limit=None, preprocess=False)
    parts["cancel"].click(lambda job: runner.cancel(job) if job else "No queued job chosen.",
                          parts["cancel_choice"], parts["queue_msg"], api_name="cancel",
                          concurrency_limit=None, preprocess=False)  # choices change per tick
