"""How a runner snapshot looks on the page: pure functions from the snapshot to values.

Kept free of gradio so that the tests read them directly: the loss curve as a pandas DataFrame
(raw, smoothed and validation series, and optionally a finished run's smoothed and validation
curves from the job history to compare with), the progress line, the log tail newest-first (a
textbox with autoscroll does not keep the newest line in view; the top of a box always is), the
queue.
"""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

MAX_POINTS = 200  # per series; longer runs are thinned evenly, the last point always kept
# (the chart draws a mark per point: a fixed count keeps the page's memory flat in a long run)
STATUS_WORDS = {
    "idle": "Idle: no training job yet",
    "queued": "Queued",
    "running": "Running",
    "finished": "Finished",
    "stopped": "Stopped",
    "failed": "Failed",
}


def thin(points: list[list[float]], limit: int = MAX_POINTS) -> list[list[float]]:
    if len(points) <= limit:
        return points
    stride = len(points) / limit
    picked = [points[int(i * stride)] for i in range(limit - 1)]
    return picked + [points[-1]]


SERIES = ("raw", "smoothed", "validation", "compared", "compared validation")


def compared_run(snap: dict[str, Any], job_id: str | None) -> dict[str, Any] | None:
    """The history entry of ``job_id`` (a finished run to draw beside this one), or None."""
    if not job_id:
        return None
    return next((h for h in snap.get("history", []) if h["job_id"] == job_id
                 and h.get("smoothed")), None)


def comparable_runs(snap: dict[str, Any]) -> list[list[str]]:
    """[label, job id] of the runs in the history that have a curve."""
    return [[f"{h['job_id']} ({h['label']}, {h['status']})", h["job_id"]]
            for h in snap.get("history", []) if h.get("smoothed")]


def loss_frame(snap: dict[str, Any], compare: dict[str, Any] | None = None) -> pd.DataFrame:
    """Columns step, loss, series (:data:`SERIES`); ``compare`` is a history entry.

    It always holds one empty (NaN) row per series: gr.LinePlot's page computes the colour
    domain from the data when it builds the chart, and rebuilds only when a setting such as
    x_lim changes; built from an empty frame, later lines would have no colour at all."""
    rows = [(0, math.nan, name) for name in SERIES]
    sources = [("raw", snap.get("loss", [])), ("smoothed", snap.get("smoothed", [])),
               ("validation", snap.get("validation", []))]
    if compare is not None:
        sources += [("compared", compare.get("smoothed", [])),
                    ("compared validation", compare.get("validation", []))]
    for name, points in sources:
        rows += [(s, v, name) for s, v in thin(points)]
    frame = pd.DataFrame(rows, columns=["step", "loss", "series"])
    return frame.astype({"step": "int64", "loss": "float64", "series": "str"})


def x_limit(snap: dict[str, Any], compare: dict[str, Any] | None = None) -> list[float]:
    """The curve's x axis: fixed to [0, total steps] so it does not rescale as points come
    (wide enough for the compared run too)."""
    total = snap.get("total") or 0
    last = snap["loss"][-1][0] if snap.get("loss") else 0
    other = compare["smoothed"][-1][0] if compare and compare.get("smoothed") else 0
    return [0, max(total, last, other, 1)]


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def status_line(snap: dict[str, Any]) -> str:
    status = snap["status"]
    words = STATUS_WORDS.get(status, status)
    if snap.get("job_id"):
        words += f" - {snap['job_id']} ({snap.get('label')})"
    if status == "running" and snap.get("stop_requested"):
        words += " - stopping at the next step"
    return words


def preparing_line(snap: dict[str, Any]) -> str:
    """The work before training (e.g. "Generating class images 3/10"), or ""."""
    prep = snap.get("preparing")
    return f"{prep['stage']} {prep['done']}/{prep['total']}" if prep else ""


def progress_html(snap: dict[str, Any]) -> str:
    """Status, a progress bar, step/total, epoch, it/s, ETA and the learning rate; before the
    first step, the bar follows the preparation (class images) and a line names it."""
    step, total = snap.get("step", 0), snap.get("total", 0)
    prep, preparing = snap.get("preparing"), preparing_line(snap)
    done, of = (prep["done"], prep["total"]) if prep else (step, total)
    pct = 100.0 * done / of if of else 0.0
    lr = snap.get("lr")
    rate = snap.get("it_per_s")
    cells = [
        ("step", f"{step} / {total or '?'}"),
        ("epoch", f"{snap.get('epoch', 0)} / {snap.get('epochs') or '?'}"),
        ("it/s", f"{rate:.2f}" if rate is not None else "-"),
        ("ETA", duration(snap.get("eta_s")) if snap["status"] == "running" else "-"),
        ("elapsed", duration(snap.get("elapsed_s"))),
        (snap.get("lr_label") or "learning rate", f"{lr:.3g}" if lr is not None else "-"),
    ]
    if snap.get("validation"):
        step_at, value = snap["validation"][-1]
        cells.append(("validation loss", f"{value:.4f} (step {step_at})"))
    status = snap["status"]
    parts = [
        f'<div class="ks-status ks-{html.escape(status)}" data-status="{html.escape(status)}">'
        f"{html.escape(status_line(snap))}</div>",
        f'<div class="ks-preparing">{html.escape(preparing)}</div>' if preparing else "",
        f'<progress class="ks-bar" max="{max(of, 1)}" value="{done}"></progress>'
        f'<span class="ks-pct">{pct:.0f}%</span>',
        '<div class="ks-cells">' + "".join(
            f'<span class="ks-cell" data-key="{html.escape(k)}"><b>{html.escape(k)}</b> '
            f"{html.escape(v)}</span>" for k, v in cells) + "</div>",
    ]
    return "\n".join(part for part in parts if part)


def log_html(snap: dict[str, Any], lines: int = 60) -> str:
    """The log tail, newest line first, so the newest is always at the top of the box."""
    tail = list(reversed(snap.get("log", [])[-lines:]))
    if not tail:
        return '<div class="ks-log"><div class="ks-line ks-empty">no log yet</div></div>'
    body = "".join(f'<div class="ks-line">{html.escape(line)}</div>' for line in tail)
    return f'<div class="ks-log" title="newest line first">{body}</div>'


def result_text(snap: dict[str, Any]) -> str:
    """The output file when finished or stopped, the config copy otherwise."""
    return snap.get("output_path") or ""


def error_markdown(snap: dict[str, Any]) -> str:
    if snap["status"] != "failed":
        return ""
    from kohya_gui.safe_text import md

    return f"**Training failed:** {md(snap.get('error') or 'no reason given', 2_000)}"


def queue_rows(snap: dict[str, Any]) -> list[list[Any]]:
    """Running, queued, then recent jobs: id, status, what."""
    rows = []
    if snap["status"] == "running" and snap.get("job_id"):
        rows.append([snap["job_id"], "running", snap.get("label") or ""])
    rows += [[q["job_id"], f"queued #{q['position']}", q["label"]] for q in snap["queue"]]
    rows += [[h["job_id"], h["status"], h["label"]] for h in snap.get("history", [])[:5]
             if h["job_id"] != snap.get("job_id") or snap["status"] != "running"]
    return rows
