"""Each training mode's default preset on this machine: wall time, steps/s and peak memory.

    python bench/modes.py [--cases lora dreambooth textual_inversion "lora tiny-sdxl"]

Runs each mode's ``presets/<mode>/default.toml`` (the embedded tiny model and the sample
dataset, as a user who clicks Train on a fresh install gets it) and ``presets/lora/tiny-sdxl``,
in a fresh process each, so each peak RSS is its own. The embedded models and dataset are built
once before the timed runs. Prints the time from ``run()`` to the first step, the whole run
(samples and saves included), steps/s over the steps after the first five, and the peak
resident memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from childproc import ROOT, StepTimes, parse_or_run_child, peak_rss_mib, run_child

MODES = ("lora", "dreambooth", "textual_inversion")
# the presets timed: each mode's default, and the embedded tiny SDXL
PRESETS = {"lora": "lora/default", "dreambooth": "dreambooth/default",
           "textual_inversion": "textual_inversion/default", "lora tiny-sdxl": "lora/tiny-sdxl"}
WARMUP = 5


def _case(preset: str, out: str) -> dict:
    """Runs inside the child process: one default-preset run, timed."""
    sys.path.insert(0, str(ROOT))
    from trainer.config import files as config_io
    from trainer.run.loop import run

    sink = StepTimes()
    cfg = config_io.load(ROOT / "presets" / f"{preset}.toml",
                         [f"saving.output_dir={out}", "training.log_with=none"])
    start = time.perf_counter()
    result = run(cfg, sink)
    total = time.perf_counter() - start
    assert result.status == "finished", result.error
    return {"steps": len(sink.times), "first_step_s": sink.times[0] - start, "total_s": total,
            "steps_per_s": sink.rate(WARMUP), "peak_rss_mib": peak_rss_mib()}


def _child(args: list[str]) -> dict:
    return run_child(__file__, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    args = parse_or_run_child(parser, _case)
    os.environ["KOHYA_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    for warm in ("lora/default", "lora/tiny-sdxl"):  # build the embedded models and data once
        _child([warm, tempfile.mkdtemp(prefix="bench-warm-")])
    print(f"default presets, {os.cpu_count()} cores (CPU training leaves one free unless "
          f"OMP_NUM_THREADS is set)")
    print(f"{'mode':<20}{'steps':>6}{'to step 1 s':>13}{'total s':>9}{'steps/s':>9}"
          f"{'peak RSS MiB':>14}")
    for case in args.cases:
        r = _child([PRESETS[case], tempfile.mkdtemp(prefix="bench-case-")])
        print(f"{case:<20}{r['steps']:>6}{r['first_step_s']:>13.1f}{r['total_s']:>9.1f}"
              f"{r['steps_per_s']:>9.2f}{r['peak_rss_mib']:>14.0f}")


if __name__ == "__main__":
    main()
