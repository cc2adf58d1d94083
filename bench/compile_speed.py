"""torch.compile of the UNet (training.compile) against eager, on this machine.

    python bench/compile_speed.py [--model embedded:tiny-sd15] [--steps 40] [--resolution 64]
                                  [--scopes eager,model,regional]

Trains a LoRA (rank 8, batch 1, fp32 on the CPU, the device's default precision elsewhere)
in fresh processes, eager, the whole UNet compiled (training.compile_scope = "model") and its
repeated blocks compiled (compile_scope = "regional"), and prints the time from run() to the end
of the first step (the compile happens there), the seconds per step after 10 untimed steps and
the run length after which the compiled run has caught up with eager (the extra first-step time
over the time saved per step). Each run gets an empty inductor cache: a warm one (a second run
of the same model) skips most of the compile.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from childproc import ROOT, StepTimes, parse_or_run_child, run_child

WARMUP = 10


def _case(model: str, steps: int, resolution: int, scope: str, out: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from trainer.config.files import from_dict
    from trainer.run.loop import run

    cfg = from_dict({
        "model": {"pretrained_model_name_or_path": model},
        "dataset": {"resolution": resolution, "enable_bucket": False},
        "network": {"network_dim": 8, "network_alpha": 8.0},
        "training": {"max_train_steps": steps, "log_with": "none", "compile": scope != "eager",
                     "compile_scope": "model" if scope == "eager" else scope},
        "saving": {"output_dir": out},
    })
    sink, start = StepTimes(), time.perf_counter()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    timed = sink.times[WARMUP:]
    return {"first_step_s": sink.times[0] - start,
            "s_per_step": (timed[-1] - timed[0]) / (len(timed) - 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="embedded:tiny-sd15")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--scopes", default="eager,model,regional")
    args = parse_or_run_child(parser, _case)
    os.environ["KOHYA_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    print(f"{args.model}, LoRA rank 8, {args.resolution} px, batch 1, {args.steps} steps")
    print(f"load: {os.getloadavg()}")
    print(f"{'run':<10}{'run() -> step 1 (s)':>22}{'s/step':>10}{'pays after (steps)':>20}")
    eager = None
    for scope in args.scopes.split(","):
        r = run_child(__file__, [args.model, args.steps, args.resolution, scope,
                                 tempfile.mkdtemp(prefix="bench-out-")],
                      TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="bench-inductor-"))
        eager = r if scope == "eager" else eager
        pays = ""
        if eager is not None and scope != "eager":
            saved = eager["s_per_step"] - r["s_per_step"]
            extra = r["first_step_s"] - eager["first_step_s"]
            pays = f"{extra / saved:.0f}" if saved > 0 else "never"
        print(f"{scope:<10}{r['first_step_s']:>22.1f}{r['s_per_step']:>10.4f}{pays:>20}",
              flush=True)
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
