"""The loss curve drawn on the server (kohya_gui/curve_svg.py): bounded, escaped, and with the
chart's series, axes and legend; the page's heap then follows the bounded content
(tests/test_soak.py)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from kohya_gui import curve_svg, progress

NS = {"svg": "http://www.w3.org/2000/svg"}


def long_run(steps: int = 5000) -> dict:
    loss = [[s, 1.0 / s] for s in range(1, steps + 1)]
    validation = [[s, 0.5] for s in range(100, steps, 100)]
    return {"loss": loss, "smoothed": loss, "validation": validation, "total": steps}


def paths(svg: str) -> dict[str, str]:
    root = ET.fromstring(svg)  # well-formed XML: every text escaped, every element closed
    return {g.get("data-series"): g.find("svg:path", NS).get("d")
            for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "mark-line"}


def test_a_long_run_draws_a_bounded_curve():
    svg = curve_svg.loss_svg(long_run())
    lines = paths(svg)
    assert set(lines) == {"raw", "smoothed", "validation"}
    for d in lines.values():
        assert d.startswith("M") and d.count("L") <= progress.MAX_POINTS - 1
    assert len(svg) < 16_000  # the same size at step 5,000 as at 50,000
    assert len(curve_svg.loss_svg(long_run(50_000))) < 16_000
    # the x axis runs to the total steps with round ticks; the legend names each series
    assert ">4000</text>" in svg and ">step</text>" in svg and ">Loss</text>" in svg
    for name in ("raw", "smoothed", "validation"):
        assert f">{name}</text>" in svg


def test_points_land_inside_the_plot_area():
    svg = curve_svg.loss_svg(long_run(300))
    xs, ys = [], []
    for d in paths(svg).values():
        for x, y in re.findall(r"[ML]([\d.]+),([\d.]+)", d):
            xs.append(float(x))
            ys.append(float(y))
    assert min(xs) >= curve_svg.LEFT and max(xs) <= curve_svg.WIDTH - curve_svg.RIGHT
    assert min(ys) >= curve_svg.TOP and max(ys) <= curve_svg.HEIGHT - curve_svg.BOTTOM
    assert max(xs) == curve_svg.WIDTH - curve_svg.RIGHT  # the last step at the right edge


def test_a_compared_run_and_a_broken_loss():
    snap = {"loss": [[1, 1.0], [2, math.nan], [3, 0.5], [4, 0.4]],
            "smoothed": [[1, 1.0], [3, 0.8]], "total": 4}
    other = {"smoothed": [[1, 0.9], [8, 0.3]], "validation": [[8, 0.35]]}
    lines = paths(curve_svg.loss_svg(snap, other))
    assert set(lines) == set(progress.SERIES) - {"validation"}  # none in this run
    assert lines["raw"].count("M") == 2  # the NaN breaks the line instead of drawing to it
    svg = curve_svg.loss_svg(snap, other)
    assert ">8</text>" in svg  # the axis is wide enough for the compared run


def test_no_points_yet():
    svg = curve_svg.loss_svg({"loss": [], "smoothed": []})
    assert paths(svg) == {} and ">Loss</text>" in svg


def test_round_ticks():
    assert curve_svg.nice_ticks(0, 2000) == [0, 500, 1000, 1500, 2000]
    assert curve_svg.nice_ticks(0.0, 1.0) == [0, 0.5, 1.0]
    assert [curve_svg.label(t) for t in curve_svg.nice_ticks(0.1, 0.35, 6)] == [
        "0.1", "0.15", "0.2", "0.25", "0.3", "0.35"]


@pytest.mark.timeout(10)  # the defect looped for ever, growing a list by 200 MB/s
def test_losses_that_differ_in_the_last_bit_draw_round_ticks():
    # A first step's raw loss and its smoothed value can differ only in the last bit of the
    # float: the tick step was then below the values' resolution, adding it changed nothing,
    # and the tick loop never ended (the GUI worker filled the memory, found in CI).
    raw, smoothed = 1.4062, math.nextafter(1.4062, 2.0)
    snap = {"loss": [[1, raw]], "smoothed": [[1, smoothed]], "total": 6}
    root = ET.fromstring(curve_svg.loss_svg(snap))
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")
              if t.get("text-anchor") == "end"]
    assert labels and len(set(labels)) == len(labels)  # distinct round values on the loss axis
    assert all(abs(float(v) - raw) < 0.1 for v in labels)
    assert len(curve_svg.nice_ticks(raw, smoothed, 6)) <= 2  # bounded whatever the range
    low, high = 1e20, math.nextafter(1e20, 2e20)
    assert 1 <= len(curve_svg.nice_ticks(low, high)) <= 10
