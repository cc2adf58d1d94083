"""CPU thread policies, idle and busy: the figures behind trainer/system/threads.py's default.

    python bench/cpu_threads.py [--model DIR] [--steps 25]

Trains a LoRA (rank 8, UNet only, 64 px, batch 1, fp32, latents cached) with each policy, in a
fresh process, first on an otherwise idle machine, then beside one process that keeps a core
busy (a Python spin loop), and prints seconds per step (after 5 untimed steps). ``--model``
takes a diffusers folder, e.g. the SD 1.5-size random model of ../shared/peers (default
$PEERS_DIR/sd15-random when it exists, else the embedded tiny model). Policies: cores-1 threads,
all cores with OpenMP's default (spinning) wait, all cores with OMP_WAIT_POLICY=PASSIVE, and the
studio's default (all cores, one fewer while other processes are busy).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childproc import ROOT, StepTimes, parse_or_run_child, peak_rss_mib, run_child

WARMUP = 5


def _case(model: str, steps: int, out: str) -> dict:
    """Runs inside the child process: one training run, timed per step."""
    sys.path.insert(0, str(ROOT))
    import torch

    from trainer.config.files import from_dict
    from trainer.run.loop import run

    sink = StepTimes()
    data = Path(out) / "data" / "10_shapes"
    data.mkdir(parents=True)
    from PIL import Image

    for i in range(4):
        Image.new("RGB", (64, 64), (60 * i, 90, 200 - 40 * i)).save(data / f"{i}.png")
        (data / f"{i}.txt").write_text(f"shape {i}")
    cfg = from_dict({
        "model": {"pretrained_model_name_or_path": model},
        "dataset": {"train_data_dir": str(data.parent), "resolution": 64, "enable_bucket": False},
        "network": {"network_dim": 8, "network_alpha": 8.0},
        "training": {"max_train_steps": steps, "mixed_precision": "no", "log_with": "none"},
        "saving": {"output_dir": out + "/out", "save_precision": "fp32"},
    })
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    timed = sink.times[WARMUP:]
    return {"s_per_step": (timed[-1] - timed[0]) / (len(timed) - 1),
            "threads_at_end": torch.get_num_threads(), "peak_rss_mib": peak_rss_mib()}


POLICIES = {  # name -> environment of the child
    "cores-1 threads": lambda cores: {"OMP_NUM_THREADS": str(max(1, cores - 1))},
    "all cores, spinning wait": lambda cores: {"OMP_NUM_THREADS": str(cores)},
    "all cores, passive wait": lambda cores: {"OMP_NUM_THREADS": str(cores),
                                              "OMP_WAIT_POLICY": "PASSIVE"},
    "studio default (adaptive)": lambda cores: {},
}


def _busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser()
    peers = Path(os.environ.get("PEERS_DIR", "/work/peers")) / "sd15-random"
    parser.add_argument("--model", default=str(peers) if peers.is_dir() else "embedded:tiny-sd15")
    parser.add_argument("--steps", type=int, default=25)
    args = parse_or_run_child(parser, _case)
    os.environ["KOHYA_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    os.environ.clear()
    os.environ.update(env)
    import torch

    cores = torch.get_num_threads()
    print(f"{args.model}: LoRA rank 8, 64 px, batch 1, fp32; {cores} cores; 1-min load "
          f"{os.getloadavg()[0]:.2f} at start")
    print(f"{'policy':<28}{'idle s/step':>12}{'busy s/step':>12}{'threads (busy)':>16}")
    for name, policy in POLICIES.items():
        row = []
        for busy in (False, True):
            spinner = _busy_process() if busy else None
            try:
                time.sleep(1.0 if busy else 0)
                r = run_child(__file__, [args.model, args.steps,
                                         tempfile.mkdtemp(prefix="bench-threads-")],
                              **policy(cores))
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            row.append(r)
        print(f"{name:<28}{row[0]['s_per_step']:>12.3f}{row[1]['s_per_step']:>12.3f}"
              f"{row[1]['threads_at_end']:>16}")


if __name__ == "__main__":
    main()
