"""Start to first step when the libraries are already imported: the GUI's Train button.

    python bench/startup_in_process.py CONFIG.toml [--runs 3]

The CLI pays for importing torch, transformers, diffusers, peft and accelerate on every run
(bench/train_imports.py lists them; about 4-6 s on a 2-core machine, which every peer pays
too). The GUI imports them once: a run started from its Train button (trainer.run.loop.run on
a background thread of the same process) begins with them in memory. This script times, in
one process, ``run(cfg)`` from its call to its first Step event, ``--runs`` times; the first
run includes the imports (what the CLI's ``python -m trainer train`` pays after the
interpreter starts), the later ones are what a GUI user waits for. Each run writes to its own
output folder (the config's ``saving.output_dir`` plus ``-runN``) and stops after one step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    started = time.perf_counter()
    from trainer.config import files as config_io
    from trainer.events import Step
    from trainer.run.loop import run

    base = config_io.load(args.config)
    firsts = []
    for n in range(1, args.runs + 1):
        data = config_io.to_dict(base)
        data.setdefault("training", {})["max_train_steps"] = 1
        data.setdefault("saving", {})["output_dir"] = f"{base.saving.output_dir}-run{n}"
        cfg = config_io.from_dict(data, str(args.config))
        seen: list[float] = []

        class Sink:
            def emit(self, event, seen=seen):
                if isinstance(event, Step) and not seen:
                    seen.append(time.perf_counter())

        start = started if n == 1 else time.perf_counter()
        result = run(cfg, Sink())
        if result.status != "finished" or not seen:
            raise SystemExit(f"run {n}: {result.status}: {result.error}")
        firsts.append(seen[0] - start)
        label = "with the imports: the CLI after python starts" if n == 1 else "imports done"
        print(f"run {n}: start -> step 1 done {firsts[-1]:.2f} s ({label})", flush=True)
    if len(firsts) > 1:
        print(f"median of runs 2-{len(firsts)} (the GUI's Train button): "
              f"{statistics.median(firsts[1:]):.2f} s")


if __name__ == "__main__":
    main()
