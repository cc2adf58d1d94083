"""Where a studio training step spends its time: the run's own set-up (trainer/run/session.py)
on a config, then a few steps as the loop runs them (loss, backward, optimizer), the last ones
under torch.profiler; prints the seconds per step, the precision chosen and the top operators
by self CPU time.

    .venv/bin/python bench/profile_step.py CONFIG.toml [--set section.key=value ...]
        [--steps 3] [--warmup 2] [--top 25] [--trace FILE.json] [--shapes]

e.g. the peers' SD 1.5-size run at 256 px (bench/compare_peers.py writes its studio.toml in each
run folder): ``bench/profile_step.py /tmp/cp/sd15_256px/ks_auto_sd15_r1/studio.toml``.
The thread count is the run's own (``OMP_NUM_THREADS`` fixes it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Reporter:
    def log(self, message: str, level: str = "info") -> None:
        print(f"[{level}] {message}", flush=True)

    def emit(self, event) -> None:
        pass

    def check_stop(self) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--warmup", type=int, default=2, help="unprofiled steps before them")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace", type=Path, help="write a Chrome trace of the profiled steps")
    p.add_argument("--shapes", action="store_true",
                   help="one row per operator and input shapes (which product runs batched)")
    args = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from trainer.config import files as config_io
    from trainer.run.session import Session, prepare
    from trainer.run.step import batch_loss

    cfg = config_io.load(args.config, args.set + ["training.log_with=none"])
    start = time.perf_counter()
    s = Session(cfg)
    prepare(s, Reporter())
    print(f"set-up {time.perf_counter() - start:.1f} s; precision {s.precision} "
          f"(dtype {s.dtype}); torch threads {torch.get_num_threads()}; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    acc, model = s.accelerator, s.model
    batches = s.data.epoch(1, cfg.training.train_batch_size, cfg.training.seed)

    def step() -> float:
        batch = next(batches)
        t = time.perf_counter()
        with acc.accumulate(*s.trained):
            with record_function("loss (forward)"):
                loss = batch_loss(batch, model, cfg, acc.device, s.dtype)
            with record_function("backward"):
                acc.backward(loss)
            with record_function("optimizer"):
                s.optimizer.step()
                s.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    plain = [step() for _ in range(args.warmup)]
    print("unprofiled steps (s): " + ", ".join(f"{x:.3f}" for x in plain), flush=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes) as prof:
        times = [step() for _ in range(args.steps)]
    print("profiled steps (s): " + ", ".join(f"{x:.3f}" for x in times), flush=True)
    averages = prof.key_averages(group_by_input_shape=args.shapes)
    for name in ("loss (forward)", "backward", "optimizer"):
        match = [e for e in averages if e.key == name]
        if match:
            print(f"  {name}: {match[0].cpu_time_total / 1e6 / args.steps:.3f} s/step")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.top))
    if args.trace:
        prof.export_chrome_trace(str(args.trace))
    s.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
