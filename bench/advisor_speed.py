"""How long the advisor's first answer takes, and how close its laws are to whole simulations.

    python bench/advisor_speed.py [--repeat 3] [--root DIR] [--no-shipped] [--accuracy]
                                  [--only NAME ...]

Speed: each case in a new process with an empty data home (no cache), the median of
``--repeat`` runs, the machine's load average beside each (this machine is shared):

- CLI: the wall time of ``python -m trainer advise PRESET --set ...``, start to exit;
- GUI: in a process that has built the app (``kohya_gui.app.build_app``: gradio and torch
  imported, as the GUI is when the page asks), the time of the advisor panel's answer
  (``kohya_gui.advisor_panel.advice_for``) for the preset's form.

``--root DIR`` runs the same children in another checkout (``git worktree add /tmp/before
REV``: the figures before a change); ``--no-shipped`` ignores the shipped laws
(trainer/advisor/shipped.py), so that each law is simulated (the first answer for a model or
a setting that is not shipped). Cases: SD 1.5-size DreamBooth at 512 px and SDXL-size LoRA at
1024 px (the families' built-in configs: no weights needed), FLUX.1-dev and SD 3.5 large LoRA
at 1024 px, and the GUI's default (the tiny model's LoRA preset).

Accuracy (``--accuracy``): the step's bytes and work from the laws against the step simulated
whole at the case's largest bucket and batch (``full``), checkpointing off and on, fp32 and
bf16, for the cases above and a few more (buckets, batches, ranks, the text encoder); for
FLUX.1 and SD 3.5 the per-block laws against the small models simulated at those values.
Minutes on a CPU (the SDXL-size steps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childproc import parse_or_run_child

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ROOT / "trainer" / "assets" / "families"


def _model(name: str) -> str:
    return f"model.pretrained_model_name_or_path={json.dumps(str(FAMILIES / name))}"


CASES = {
    "sd15-dreambooth-512": ("SD 1.5-size DreamBooth, 512 px", "presets/dreambooth/default.toml",
                            [_model("sd1"), "dataset.resolution=512",
                             "sampling.sample_prompts=[]"]),
    "sdxl-lora-1024": ("SDXL-size LoRA, 1024 px", "presets/lora/default.toml",
                       [_model("sdxl"), "dataset.resolution=1024"]),
    "flux1-dev-lora-1024": ("FLUX.1-dev LoRA, 1024 px (16 GB preset)",
                            "presets/lora/flux1-dev-16gb.toml", [_model("flux1-dev")]),
    "sd35-large-lora-1024": ("SD 3.5 large LoRA, 1024 px (16 GB preset)",
                             "presets/lora/sd35-large-16gb.toml", [_model("sd35-large")]),
    "tiny-lora-default": ("tiny LoRA (the GUI's default preset)", "presets/lora/default.toml",
                          []),
}


def _no_shipped() -> None:
    from trainer.advisor import shipped

    shipped._LOADED["index"] = {}


def _child(kind: str, case: str, no_shipped: bool) -> dict:
    """Runs in a new process (cwd: the checkout measured)."""
    sys.path.insert(0, os.getcwd())
    _, preset, overrides = CASES[case]
    if kind == "cli":
        start = time.perf_counter()
        if no_shipped:
            _no_shipped()
        from trainer.cli import main

        with open(os.devnull, "w") as null:
            stdout, sys.stdout = sys.stdout, null
            try:
                code = main(["advise", preset] + [a for o in overrides for a in ("--set", o)])
            finally:
                sys.stdout = stdout
        return {"seconds": time.perf_counter() - start, "ok": code == 0}
    from kohya_gui.app import build_app

    build_app()  # what the GUI has imported when the page asks
    from kohya_gui.advisor_panel import advice_for
    from kohya_gui.fields import Form
    from trainer.config import files as config_io

    if no_shipped:
        _no_shipped()
    cfg = config_io.load(preset, overrides)
    form = Form(cfg.mode)
    values = form.values(cfg)
    start = time.perf_counter()
    short, _, _ = advice_for(form, values)
    return {"seconds": time.perf_counter() - start, "ok": "Estimated peak memory" in short}


def _run(kind: str, case: str, root: Path, no_shipped: bool) -> tuple[float, str]:
    """(seconds, load average) of one cold run."""
    home = tempfile.mkdtemp(prefix="advisor-speed-")
    env = {**os.environ, "KOHYA_STUDIO_HOME": home, "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() \
        else "?"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child",
           json.dumps([kind, case, no_shipped])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["ok"]:
        raise SystemExit(f"{case} ({kind}): no estimate")
    # the CLI's figure is the process's whole life, interpreter start included
    return (wall if kind == "cli" else got["seconds"]), load


def speed(args: argparse.Namespace) -> None:
    root = Path(args.root).resolve() if args.root else ROOT
    print(f"checkout: {root}; shipped laws: {'ignored' if args.no_shipped else 'used if any'}; "
          f"{os.cpu_count()} cores; median of {args.repeat} cold runs\n")
    print("| case | CLI (whole process) | GUI (the panel's answer) | load averages |")
    print("|---|---:|---:|---|")
    for case in args.only or CASES:
        cells, loads = [], []
        for kind in ("cli", "gui"):
            runs = [_run(kind, case, root, args.no_shipped) for _ in range(args.repeat)]
            cells.append(f"{statistics.median(s for s, _ in runs):.2f} s")
            loads += [load for _, load in runs]
        print(f"| {CASES[case][0]} | {cells[0]} | {cells[1]} | {' '.join(loads)} |",
              flush=True)


# --- accuracy --------------------------------------------------------------------------------

EXTRA = [  # (label, preset, overrides): more points for the laws against whole simulations
    ("SD 1.5-size LoRA rank 32, 768 px, batch 3", "presets/lora/default.toml",
     [_model("sd1"), "dataset.resolution=768", "training.train_batch_size=3",
      "network.network_dim=32", "network.network_alpha=16.0"]),
    ("SD 1.5-size LoRA + text encoder, 640 px", "presets/lora/default.toml",
     [_model("sd1"), "dataset.resolution=640", "network.train_text_encoder=true"]),
    ("SD 1.5-size LoRA, 672 px (off the UNet's 64 px grid)", "presets/lora/default.toml",
     [_model("sd1"), "dataset.resolution=672"]),
]


def accuracy(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from trainer.advisor import flow_memory, footprint
    from trainer.advisor.estimate import step_arithmetic
    from trainer.advisor.flow_advice import flow_transformer_config
    from trainer.config import files as config_io

    print("| case (largest bucket, batch; fp32 and bf16) | checkpointing | step's bytes: laws "
          "| whole simulation | error | TFLOP error |")
    print("|---|---|---:|---:|---:|---:|")
    todo = [(CASES[c][0], CASES[c][1], CASES[c][2]) for c in args.only or CASES] + EXTRA
    for label, preset, overrides in todo:
        cfg = config_io.load(preset, overrides)
        bucket, batch = step_arithmetic(cfg).largest_bucket, cfg.training.train_batch_size
        config = flow_transformer_config(cfg.model)
        for gc in (False, True):
            if config is not None:  # the per-block laws against the small models simulated
                law = flow_memory.simulate_flow_step(config, cfg, bucket, batch, gc)
                peaks = [flow_memory._simulate(flow_memory._small_model(config, b, cfg),
                                               config, bucket, batch, gc)
                         for b in flow_memory._shapes(config)]
                fixed, first, second = flow_memory._extrapolate(config, peaks)
                doubles, singles = flow_memory._block_counts(config)
                whole = int(fixed + doubles * first + singles * second)
                print(f"| {label} ({bucket[0]}x{bucket[1]}, {batch}; bf16) | {gc} | "
                      f"{law / 2**30:.3f} GiB | {whole / 2**30:.3f} GiB | "
                      f"{(law - whole) / whole * 100:+.3f}% | (a formula) |", flush=True)
                continue
            configs = footprint.read_configs(cfg.model)
            for dtype in (torch.float32, torch.bfloat16):  # the law, even off the grid
                law = footprint.step_law(configs, cfg, dtype, gc, batch)
                a = footprint.law_footprint(law, configs, cfg, bucket, batch, dtype)
                b = footprint.simulate_step(configs, cfg, bucket, batch, dtype, gc, full=True)
                print(f"| {label} ({bucket[0]}x{bucket[1]}, {batch}; {str(dtype)[6:]}) | {gc} "
                      f"| {a.step_bytes / 2**30:.3f} GiB | {b.step_bytes / 2**30:.3f} GiB | "
                      f"{(a.step_bytes - b.step_bytes) / b.step_bytes * 100:+.3f}% | "
                      f"{(a.flops - b.flops) / b.flops * 100:+.3f}% |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", help="another checkout to measure (e.g. a git worktree)")
    parser.add_argument("--no-shipped", action="store_true", help="simulate every law")
    parser.add_argument("--accuracy", action="store_true", help="the laws against whole "
                        "simulations (minutes), instead of the speed")
    parser.add_argument("--only", nargs="+", choices=list(CASES))
    args = parse_or_run_child(parser, _child)
    if args.accuracy:
        os.environ.setdefault("KOHYA_STUDIO_HOME", tempfile.mkdtemp(prefix="advisor-acc-"))
        accuracy(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
