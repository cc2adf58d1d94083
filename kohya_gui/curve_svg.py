"""The loss curve as an SVG drawn on the server and sent to the page as HTML.

Gradio's LinePlot (Vega) was re-rendered by every poll that brought new points, and the page's
JS heap grew with each render (27-38 % from step 200 to 2,000 of the default preset, flat with
its updates switched off), although its element count stayed fixed. An SVG string in a
``gr.HTML`` replaces the element's content: nothing of the old chart stays reachable, so the
page's memory follows the content, which is bounded: at most :data:`progress.MAX_POINTS` points
per series (a path each), fixed axes, ticks and a legend.

The look is the chart's: title "Loss", x from 0 to the run's total steps, y fitted to the
points, the raw loss light blue, the smoothed dark blue, the validation loss orange, and a
finished run to compare with in greys. Every text in the SVG is escaped; the numbers are
formatted here.
"""

from __future__ import annotations

import html
import math
from typing import Any

from kohya_gui import progress

COLORS = {"raw": "#9ecae1", "smoothed": "#08519c", "validation": "#e6550d",
          "compared": "#969696", "compared validation": "#fdae6b"}
WIDTH, HEIGHT = 480, 240  # the panel's width on a laptop; the SVG scales to the width
LEFT, RIGHT, TOP, BOTTOM = 50, 12, 40, 34  # the plot area's margins (axes, labels, legend)
DOTTED = {"validation", "compared validation"}  # few points: a mark at each (up to MARKS)
MARKS = 60


def series(snap: dict[str, Any], compare: dict[str, Any] | None = None
           ) -> dict[str, list[list[float]]]:
    """The points of each series (:data:`progress.SERIES`), thinned to MAX_POINTS each;
    ``compare`` is a history entry (a finished run)."""
    out = {"raw": snap.get("loss", []), "smoothed": snap.get("smoothed", []),
           "validation": snap.get("validation", [])}
    if compare is not None:
        out["compared"] = compare.get("smoothed", [])
        out["compared validation"] = compare.get("validation", [])
    return {name: progress.thin(list(points)) for name, points in out.items()}


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 times a power of ten apart) in [low, high].

    The ticks are counted as whole multiples of the step, never by adding the step up: a range
    narrower than the values' float resolution (a raw loss and its smoothed value that differ
    in the last bit) has a step that adding to the value does not change, which looped for ever
    and filled the memory."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else []
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    ticks: list[float] = []
    for index in range(first, min(last, first + 2 * count) + 1):
        value = 0.0 if index == 0 else index * step
        if not ticks or value > ticks[-1]:  # equal values past the float resolution: one tick
            ticks.append(value)
    return ticks


def y_range(lines: dict[str, list[list[float]]]) -> tuple[float, float]:
    """The loss axis: the finite values' range, widened by 5 % each side ([0, 1] if none).
    Values equal to about a millionth of their size are drawn as equal (widened by 5 % of
    their size), so that the ticks are round numbers that their labels tell apart."""
    values = [v for points in lines.values() for _, v in points if math.isfinite(v)]
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    size = max(abs(low), abs(high))
    if high - low > size * 1e-6:
        pad = (high - low) * 0.05
    else:
        pad = size * 0.05 or 0.5
    return low - pad, high + pad


def label(value: float) -> str:
    """A tick label: short, without float noise (0.30000000000000004 -> 0.3)."""
    return f"{value:.4g}"


class Frame:
    """Data coordinates -> SVG coordinates of the plot area."""

    def __init__(self, x_lim: list[float], y_lim: tuple[float, float]):
        self.x0, self.x1 = x_lim
        self.y0, self.y1 = y_lim
        self.w, self.h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(self, value: float) -> float:
        span = (self.x1 - self.x0) or 1
        return LEFT + self.w * (min(max(value, self.x0), self.x1) - self.x0) / span

    def y(self, value: float) -> float:
        span = (self.y1 - self.y0) or 1
        return TOP + self.h * (1 - (value - self.y0) / span)


def path_d(points: list[list[float]], frame: Frame) -> str:
    """An SVG path through the points; a non-finite loss breaks the line."""
    parts, pen_down = [], False
    for step, value in points:
        if not math.isfinite(value):
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{frame.x(step):.1f},{frame.y(value):.1f}")
        pen_down = True
    return " ".join(parts)


def _axes(frame: Frame) -> list[str]:
    text = 'fill="currentColor" font-size="11"'
    out = [f'<g class="ks-axes" stroke="currentColor" stroke-opacity="0.35">'
           f'<line x1="{LEFT}" y1="{TOP + frame.h}" x2="{LEFT + frame.w}" '
           f'y2="{TOP + frame.h}"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
           f'y2="{TOP + frame.h}"/></g>']
    for tick in nice_ticks(frame.y0, frame.y1, 6):
        y = frame.y(tick)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + frame.w}" y2="{y:.1f}" '
                   f'stroke="currentColor" stroke-opacity="0.1"/>'
                   f'<text x="{LEFT - 5}" y="{y + 4:.1f}" text-anchor="end" {text}>'
                   f"{html.escape(label(tick))}</text>")
    for tick in nice_ticks(frame.x0, frame.x1):
        x = frame.x(tick)
        out.append(f'<text x="{x:.1f}" y="{TOP + frame.h + 14}" text-anchor="middle" {text}>'
                   f"{html.escape(label(tick))}</text>")
    out.append(f'<text x="{LEFT + frame.w / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle" '
               f'{text}>step</text><text x="12" y="{TOP + frame.h / 2:.0f}" {text} '
               f'text-anchor="middle" transform="rotate(-90 12 {TOP + frame.h / 2:.0f})">'
               "loss</text>")
    return out


def _legend(names: list[str]) -> str:
    items, x = [], LEFT
    for name in names:
        items.append(f'<line x1="{x}" y1="26" x2="{x + 16}" y2="26" stroke="{COLORS[name]}" '
                     f'stroke-width="2.5"/><text x="{x + 20}" y="30" font-size="11" '
                     f'fill="currentColor">{html.escape(name)}</text>')
        x += 28 + 7 * len(name)
    return f'<g class="ks-legend">{"".join(items)}</g>'


def _line(name: str, points: list[list[float]], frame: Frame) -> str:
    color = COLORS[name]
    marks = ""
    if name in DOTTED and len(points) <= MARKS:
        marks = "".join(f'<circle cx="{frame.x(s):.1f}" cy="{frame.y(v):.1f}" r="2.5" '
                        f'fill="{color}"/>' for s, v in points if math.isfinite(v))
    return (f'<g class="mark-line" data-series="{html.escape(name)}">'
            f'<path d="{path_d(points, frame)}" fill="none" stroke="{color}" '
            f'stroke-width="{2 if name == "smoothed" else 1.5}" stroke-linejoin="round"/>'
            f"{marks}</g>")


def loss_svg(snap: dict[str, Any], compare: dict[str, Any] | None = None) -> str:
    """The whole chart: title, legend, axes with round ticks, one path per series with
    points (raw, smoothed, validation; a compared run's smoothed and validation)."""
    lines = {name: points for name, points in series(snap, compare).items() if points}
    frame = Frame(progress.x_limit(snap, compare), y_range(lines))
    body = [f'<text x="{LEFT}" y="14" font-size="13" font-weight="bold" '
            f'fill="currentColor">Loss</text>', _legend(list(lines)), *_axes(frame)]
    body += [_line(name, points, frame) for name, points in lines.items()]
    return (f'<svg class="ks-curve" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
            f'style="height:auto;max-height:{HEIGHT * 3 // 2}px" role="img" '
            f'aria-label="Loss curve" xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>')
