"""The soak (issue 22), shorter: the default preset through the GUI's runner with the page open;
the server's resident memory and the page's JS heap (after a forced garbage collection) stay
flat after warm-up: under 5 % growth from step 200 to the end. The page's content is bounded
(the curve is an SVG of at most 200 points per series built on the server, kohya_gui/curve_svg.py;
the log is bounded); Gradio's LinePlot, which it replaced, grew the heap by about 2.5 MB per 100
steps. `python bench/soak.py` is the 2,000-step version."""

from __future__ import annotations

import sys

import pytest
from gui_helpers import PROJECT, gui_home  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_memory_stays_flat_after_warm_up(gui_home, tmp_path):  # noqa: F811
    sys.path.insert(0, str(PROJECT / "bench"))
    from soak import soak

    result = soak(steps=400, warmup=200, every=50, out_dir=tmp_path / "out")
    rss, heap = result["endpoints"]["rss"], result["endpoints"]["heap"]
    assert rss["to_step"] == 400 and heap["to_step"] == 400
    assert rss["growth"] < 0.05, result["rss"]
    assert heap["growth"] < 0.05, result["heap"]
