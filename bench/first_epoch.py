"""The CPU's lazy caches against encoding everything before step 1, on one config.

    python bench/first_epoch.py CONFIG.toml [--steps 30]

On the CPU the studio encodes each image and caption when the first epoch first reaches it
(trainer/run/caches.py); a GPU run encodes them all before step 1. This runs the config both
ways, each in a fresh process, and prints when step 1 is done, s/step over steps 10-20 and 20-N
and when step N is done (from the run's call; the libraries are imported before it). The total
is the same work moved: what the lazy cache saves before step 1 the first epoch's steps pay as
they meet new images. A peer comparison that times steps inside the first epoch
(bench/compare_peers.py: steps 10-20) therefore shows the studio's steps slower by that
encoding; the eager row here is its steady s/step.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(config: str, mode: str, steps: int) -> None:
    sys.path.insert(0, str(ROOT))
    import trainer.run.caches as caches
    from trainer.config import files as config_io
    from trainer.events import Step
    from trainer.run.loop import run

    if mode == "eager":  # what a GPU run does
        caches.lazy = lambda s: False
    data = config_io.to_dict(config_io.load(config))
    data["training"]["max_train_steps"] = steps
    data["saving"]["output_dir"] = f"{data['saving']['output_dir']}-{mode}"
    cfg = config_io.from_dict(data, config)
    start, times = time.perf_counter(), {}

    class Sink:
        def emit(self, event):
            if isinstance(event, Step):
                times[event.step] = time.perf_counter() - start

    result = run(cfg, Sink())
    if result.status != "finished":
        raise SystemExit(f"{mode}: {result.status}: {result.error}")
    late = (times[steps] - times[20]) / (steps - 20)
    print(f"| {mode} | {times[1]:.1f} s | {(times[20] - times[10]) / 10:.3f} | {late:.3f} | "
          f"{times[steps]:.1f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", choices=("eager", "lazy"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 25:
        raise SystemExit("--steps must be at least 25")
    if args.child:
        _child(args.config, args.child, args.steps)
        return
    print(f"| caches | step 1 done | s/step 10-20 | s/step 20-{args.steps} | "
          f"step {args.steps} done |\n|---|---|---|---|---|", flush=True)
    for mode in ("eager", "lazy"):
        out = subprocess.run([sys.executable, __file__, args.config, "--steps", str(args.steps),
                              "--child", mode], capture_output=True, text=True)
        rows = [line for line in out.stdout.splitlines() if line.startswith("|")]
        print(rows[-1] if rows else f"{mode} failed: {out.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
