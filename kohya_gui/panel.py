"""The Training panel under the tabs: progress, loss curve, log, output, samples and the queue.

Everything here is drawn from ``Runner.snapshot()`` by a ``gr.Timer`` tick (no generator
handler: a generator dies with its tab, the runner's state does not), so a reloaded page or a
second tab shows the same job. Each page remembers in a ``gr.State`` what it last drew and only
sends what changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from kohya_gui import progress
from kohya_gui.runner import Runner

POLL_SECONDS = 1.0
QUEUE_HEADERS = ["job", "status", "what"]
COLORS = {"raw": "#9ecae1", "smoothed": "#08519c"}


def _inside(path: str, folder: str | None) -> bool:
    if not folder:
        return False
    try:
        return Path(path).resolve().is_relative_to(Path(folder))
    except OSError:
        return False


def _plot_update(snap: dict[str, Any], seen: dict[str, Any], new_seen: dict[str, Any]) -> Any:
    """The curve's update, or None. The x axis limit and the points never travel together:
    measured, the page's chart then draws empty lines (it rebuilds for the new limit with the
    old points); so a new limit goes alone and the points follow on the next tick."""
    x_lim = progress.x_limit(snap)
    new_seen["x_lim"] = x_lim
    key = [snap.get("job_id"), len(snap["loss"])]
    if x_lim != seen.get("x_lim"):
        new_seen["plot"] = None
        return gr.LinePlot(x_lim=x_lim)
    new_seen["plot"] = key
    return gr.LinePlot(progress.loss_frame(snap)) if key != seen.get("plot") else None


def render(snap: dict[str, Any], seen: dict[str, Any], parts: dict[str, Any]) -> dict[Any, Any]:
    """The updates for one tick: only what changed since ``seen`` (this page's last tick)."""
    same_job = seen.get("job_id") == snap.get("job_id")
    plot_done = seen.get("plot") == [snap.get("job_id"), len(snap["loss"])]
    if (snap["version"] == seen.get("version") and same_job and plot_done
            and snap["status"] != "running"):
        return {parts["seen"]: seen}  # nothing new (an empty dict would read as one value)
    out: dict[Any, Any] = {parts["progress"]: progress.progress_html(snap)}
    new_seen = {"version": snap["version"], "job_id": snap.get("job_id"),
                "queue": [q["job_id"] for q in snap["queue"]],
                "samples": len(snap["samples"]), "rows": progress.queue_rows(snap)}
    if snap["version"] != seen.get("version") or not same_job:
        out[parts["log"]] = progress.log_html(snap)
        out[parts["output"]] = progress.result_text(snap)
        out[parts["error"]] = gr.Markdown(progress.error_markdown(snap),
                                          visible=snap["status"] == "failed")
    plot = _plot_update(snap, seen, new_seen)
    if plot is not None:
        out[parts["plot"]] = plot
    if new_seen["rows"] != seen.get("rows"):
        out[parts["queue"]] = pd.DataFrame(new_seen["rows"], columns=QUEUE_HEADERS)
    if new_seen["queue"] != seen.get("queue"):
        out[parts["cancel_choice"]] = gr.Dropdown(choices=new_seen["queue"],
                                                  value=(new_seen["queue"] or [None])[0])
    if not same_job or new_seen["samples"] != seen.get("samples"):
        images = [(p, c) for p, c in progress.sample_images(snap)
                  if _inside(p, snap.get("output_dir"))]
        out[parts["gallery"]] = gr.Gallery(images, visible=bool(images))
    out[parts["seen"]] = new_seen
    return out


def build_panel(runner: Runner) -> dict[str, Any]:
    """Lay the panel out in the current Blocks and start polling the runner."""
    parts: dict[str, Any] = {}
    with gr.Column(elem_id="training-panel"):
        gr.Markdown("## Training", elem_id="training-title")
        parts["progress"] = gr.HTML(progress.progress_html(runner.snapshot()), elem_id="progress")
        with gr.Row():
            parts["stop"] = gr.Button("Stop", variant="stop", size="sm", elem_id="stop")
            parts["stop_msg"] = gr.Markdown(elem_id="stop-msg")
        parts["error"] = gr.Markdown(visible=False, elem_id="train-error")
        parts["output"] = gr.Textbox(label="Output file", interactive=False, max_lines=1,
                                     elem_id="output-path")
        with gr.Row(equal_height=False):
            parts["plot"] = gr.LinePlot(
                progress.loss_frame({"loss": [], "smoothed": []}), x="step", y="loss",
                color="series", color_map=COLORS, x_lim=[0, 1], title="Loss", height=300,
                scale=3, elem_id="loss-plot")
            parts["log"] = gr.HTML(progress.log_html({}), label="Log (newest first)",
                                   elem_id="log-tail", padding=False, scale=2, min_width=320)
        parts["gallery"] = gr.Gallery(label="Sample images", columns=4, height=260, visible=False,
                                      elem_id="samples")
        with gr.Accordion("Queue", open=True, elem_id="queue"):
            parts["queue"] = gr.Dataframe(pd.DataFrame([], columns=QUEUE_HEADERS),
                                          interactive=False, elem_id="queue-table", max_height=220)
            with gr.Row(equal_height=True):
                parts["cancel_choice"] = gr.Dropdown(choices=[], value=None, label="Queued job",
                                                     scale=3, elem_id="cancel-choice")
                parts["cancel"] = gr.Button("Cancel queued job", size="sm", scale=1,
                                            elem_id="cancel")
            parts["queue_msg"] = gr.Markdown(elem_id="queue-msg")
    parts["seen"] = gr.State({})
    parts["timer"] = gr.Timer(POLL_SECONDS)
    _wire(runner, parts)
    return parts


def _wire(runner: Runner, parts: dict[str, Any]) -> None:
    outputs = [parts[k] for k in ("progress", "log", "output", "error", "plot", "queue",
                                  "cancel_choice", "gallery", "seen")]

    def tick(seen: dict[str, Any]) -> dict[Any, Any]:
        return render(runner.snapshot(), seen or {}, parts)

    poll = {"concurrency_limit": None, "show_progress": "hidden", "api_visibility": "private"}
    parts["timer"].tick(tick, parts["seen"], outputs, **poll)
    # On page load: draw at once (the axis first, the points right after) instead of waiting
    # for two ticks of the timer.
    parts["load"] = lambda demo: demo.load(tick, parts["seen"], outputs, **poll).then(
        tick, parts["seen"], outputs, **poll)
    parts["stop"].click(runner.stop, None, parts["stop_msg"], api_name="stop",
                        concurrency_limit=None)
    parts["cancel"].click(lambda job: runner.cancel(job) if job else "No queued job chosen.",
                          parts["cancel_choice"], parts["queue_msg"], api_name="cancel",
                          concurrency_limit=None, preprocess=False)  # choices change per tick
