"""Long-run soak: does the studio's memory stay flat while a run goes on?

    python bench/soak.py [--steps 2000] [--warmup 200] [--every 50] [--no-page]

Starts the studio's app in this process (the real runner, the real trainer) on the default
LoRA preset cut to ``--steps`` steps (the preset's embedded model and sample dataset), opens the
page in headless Chromium (/usr/bin/chromium) and, every ``--every`` steps, records the server's
resident memory (this process) and the page's JavaScript heap (Chrome DevTools'
``JSHeapUsedSize`` after a garbage collection) while the page polls the run as a user's would.
Prints both curves' endpoints: the value at the first sample at or after ``--warmup`` steps and
at the end, and the growth between them; exits 1 when either grows 5 % or more.
:func:`soak` is what ``tests/test_soak.py`` runs, shorter.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
LIMIT = 0.05


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _page_heap(cdp: Any, readings: int = 3) -> int:
    """The page's live JS heap: the least of ``readings`` reads, each after a forced garbage
    collection (a poll's answer being handled at that moment reads up to 5 % higher)."""
    return min(_heap_once(cdp) for _ in range(readings))


def _heap_once(cdp: Any) -> int:
    cdp.send("HeapProfiler.collectGarbage")
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    if os.environ.get("SOAK_DEBUG"):
        print({k: metrics[k] for k in ("Nodes", "JSEventListeners", "Documents",
                                       "JSHeapUsedSize", "LayoutObjects")}, flush=True)
        expr = ("JSON.stringify(['#loss-plot', '#log-tail', '#progress', '#queue-table', "
                "'#samples', 'body'].map(s => [s, document.querySelectorAll(s + ' *').length]))")
        print(cdp.send("Runtime.evaluate", {"expression": expr})["result"]["value"], flush=True)
    return int(metrics["JSHeapUsedSize"])


def soak(steps: int = 2000, warmup: int = 200, every: int = 50, page: bool = True,
         out_dir: Path | None = None) -> dict[str, Any]:
    """Run ``steps`` steps of the default preset through the GUI's runner with the page open;
    returns {"steps", "rss": [(step, bytes)], "heap": [(step, bytes)], "endpoints": {...}}."""
    import torch

    from kohya_gui.app import build_app, launch
    from kohya_gui.runner import Runner
    from trainer.config import files as config_io

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="soak-"))
    cfg = config_io.load(ROOT / "presets" / "lora" / "default.toml", [
        f"saving.output_dir={json.dumps(str(out_dir))}", f"training.max_train_steps={steps}",
        "training.max_train_epochs=100000"])
    runner = Runner(write_config=False)
    demo = build_app(runner)
    port = _free_port()
    launch(demo, port=port, prevent_thread_lock=True, quiet=True)
    rss: list[tuple[int, int]] = []
    heap: list[tuple[int, int]] = []
    pw = browser = cdp = None
    try:
        if page:
            from playwright.sync_api import sync_playwright

            pw = sync_playwright().start()
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
            tab = browser.new_page()
            tab.goto(f"http://127.0.0.1:{port}/")
            tab.wait_for_selector("#training-panel", timeout=120_000)
            cdp = tab.context.new_cdp_session(tab)
            cdp.send("Performance.enable")
        runner.submit(cfg)
        next_at = every
        while True:
            snap = runner.snapshot()
            step = snap["step"]
            if step >= next_at or snap["status"] in ("finished", "failed", "stopped"):
                gc.collect()
                rss.append((step, _rss()))
                if cdp is not None:
                    heap.append((step, _page_heap(cdp)))
                next_at = step + every
            if snap["status"] in ("finished", "failed", "stopped"):
                break
            time.sleep(0.2)
        if snap["status"] != "finished":
            raise RuntimeError(f"the soak run ended {snap['status']}: {snap.get('error')}")
    finally:
        if browser is not None:
            browser.close()
        if pw is not None:
            pw.stop()
        runner.close()
        demo.close()
    return {"steps": steps, "warmup": warmup, "rss": rss, "heap": heap,
            "endpoints": {"rss": endpoints(rss, warmup), "heap": endpoints(heap, warmup)}}


def endpoints(curve: list[tuple[int, int]], warmup: int) -> dict[str, Any] | None:
    """The first value at or after ``warmup`` steps, the last, and the growth between."""
    after = [(s, v) for s, v in curve if s >= warmup]
    if len(after) < 2:
        return None
    (s0, v0), (s1, v1) = after[0], after[-1]
    return {"from_step": s0, "from": v0, "to_step": s1, "to": v1, "growth": (v1 - v0) / v0}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _line(name: str, ends: dict[str, Any] | None) -> str:
    if ends is None:
        return f"{name}: not measured"
    mib = 2**20
    return (f"{name}: {ends['from'] / mib:.1f} MiB at step {ends['from_step']} -> "
            f"{ends['to'] / mib:.1f} MiB at step {ends['to_step']} "
            f"({ends['growth']:+.2%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--no-page", action="store_true", help="measure the server only")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    started = time.monotonic()
    result = soak(args.steps, args.warmup, args.every, page=not args.no_page)
    print(f"soak: {args.steps} steps of presets/lora/default.toml in "
          f"{time.monotonic() - started:.0f} s, samples every {args.every} steps")
    print(_line("server resident memory", result["endpoints"]["rss"]))
    print(_line("page JS heap", result["endpoints"]["heap"]))
    bad = [k for k, v in result["endpoints"].items() if v and v["growth"] >= LIMIT]
    if bad:
        print(f"grew {LIMIT:.0%} or more: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
