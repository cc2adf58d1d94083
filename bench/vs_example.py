"""What the benches of a studio LoRA against a diffusers training example share
(bench/zimage_lora_vs_diffusers.py, bench/flux2_klein_lora_vs_diffusers.py): the images, the
arguments, one measured run of either tool, the rounds that alternate the tools, and the table
of medians. How a run is measured: bench/example_procs.py."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import tomli_w
from example_procs import cpu_at, cpu_kind, run_measured, wait_for_load

ROOT = Path(__file__).resolve().parent.parent
CAPTION = "a red circle, shapes"
IMAGES = 6
SIZE = 256
SEED = 42
TOOLS = ("diffusers", "studio")
STEP_RE = {"diffusers": r"\s*Steps:\s+\d+%\|.*?\|\s*(\d+)/{n} \[",
           "studio": r"\s*(\d+)/{n} \(\d+%\)"}
TARGET = 0.8


def build_images(out: Path, count: int = IMAGES) -> None:
    """``count`` 256 px images of coloured shapes on light backgrounds (fixed seed), in
    ``out/images`` (images only, as the examples read a folder with one ``--instance_prompt``)
    and ``out/data/1_shape`` (with a caption file each, as the studio reads them)."""
    from PIL import Image, ImageDraw

    rng = random.Random(SEED)
    plain, captioned = out / "images", out / "data" / "1_shape"
    for folder in (plain, captioned):
        folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img = Image.new("RGB", (SIZE, SIZE), tuple(rng.randint(190, 255) for _ in range(3)))
        r, cx, cy = rng.randint(40, 80), rng.randint(90, 166), rng.randint(90, 166)
        fill = tuple(rng.randint(0, 160) for _ in range(3))
        ImageDraw.Draw(img).ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        for folder in (plain, captioned):
            img.save(folder / f"{i:02d}.png")
        (captioned / f"{i:02d}.txt").write_text(CAPTION, encoding="utf-8")


def add_arguments(parser: argparse.ArgumentParser, example: str, work: str) -> None:
    """The arguments every such bench takes (``example``: the script's file name)."""
    parser.add_argument("--example", required=True, help=f"the folder holding {example}")
    parser.add_argument("--df-python", default=sys.executable)
    parser.add_argument("--df-pythonpath", default="",
                        help="PYTHONPATH of the example's process only (e.g. a folder holding "
                        "torchvision, which the studio's venv lacks)")
    parser.add_argument("--work", default=work)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", action="store_true", help="one unmeasured run of each first")
    parser.add_argument("--only", default=",".join(TOOLS))
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--load-wait", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--studio-root", default=str(ROOT),
                        help="the checkout whose trainer/ runs (default: this one)")
    parser.add_argument("--runs-tag", default="", help="a prefix of this bench's run folders")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="OMP_NUM_THREADS of both (0: each tool's own choice; the studio "
                        "takes one core fewer while other processes keep one busy)")
    parser.add_argument("--df-args", nargs="*", default=[])
    parser.add_argument("--studio-args", nargs="*", default=[])
    parser.add_argument("--studio-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the studio's run (its --set), e.g. "
                             "training.compile=true; repeat for more")


def run_dir(args, tool: str, rep: str) -> Path:
    """The emptied output folder of one run (its log and config sit beside it)."""
    out = Path(args.work) / "runs" / f"{args.runs_tag}{tool}_{rep}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def studio_config(model: Path, data: Path, out: Path, steps: int) -> dict:
    """The studio's side of a bench: LoRA rank 4 alpha 4 on the transformer, AdamW at 1e-4
    constant, batch 1, 256 px without buckets, fp32, seed 42 (the examples' defaults)."""
    return {
        "schema_version": 1, "mode": "lora",
        "model": {"pretrained_model_name_or_path": str(model)},
        "dataset": {"train_data_dir": str(data), "resolution": 256, "enable_bucket": False},
        "network": {"network_dim": 4, "network_alpha": 4.0, "train_text_encoder": False},
        "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1e-4,
                      "lr_scheduler": "constant"},
        "training": {"train_batch_size": 1, "max_train_steps": steps, "mixed_precision": "no",
                     "seed": 42, "log_with": "none"},
        "saving": {"output_dir": str(out), "save_precision": "fp32"},
    }


def studio_cmd(args, config: dict, out: Path) -> list[str]:
    """``python -m trainer train`` on ``config`` (written beside ``out``); run it in
    ``--studio-root``, whose trainer/ is then the one imported."""
    path = out.parent / f"{out.name}.toml"
    path.write_text(tomli_w.dumps(config))
    return [str(ROOT / ".venv/bin/python"), "-m", "trainer", "train", str(path),
            *args.studio_args, *(f"--set={item}" for item in args.studio_set)]


def step_times(segments: list[tuple[float, str]], tool: str, steps: int) -> dict[int, float]:
    """Step number -> seconds from launch of its first progress update."""
    pattern = re.compile(STEP_RE[tool].format(n=steps))
    first: dict[int, float] = {}
    for t, text in segments:
        if m := pattern.match(text):
            first.setdefault(int(m.group(1)), t)
    return first


def summarize(run: dict, tool: str, steps: int) -> dict:
    first = step_times(run["segments"], tool, steps)
    pairs = [(first[k - 1], first[k]) for k in range(2, steps + 1)
             if k in first and k - 1 in first]
    singles = [b - a for a, b in pairs]
    samples = run.get("cpu") or []
    cpu = [cpu_at(samples, b) - cpu_at(samples, a) for a, b in pairs
           if cpu_at(samples, a) is not None and cpu_at(samples, b) is not None]
    return {"rc": run["rc"], "wall_s": round(run["wall_s"], 1), "load": run["load_before"],
            "step1_s": round(first[1], 1) if 1 in first else None,
            "s_per_step": round(statistics.median(singles), 2) if singles else None,
            "cpu_s_per_step": round(statistics.median(cpu), 2) if cpu else None,
            "steps": [round(s, 2) for s in singles],
            "peak_gib": round(max(run["tree_peak"], run["maxrss"]) / 2**30, 2),
            "tree_peak_gib": round(run["tree_peak"] / 2**30, 2),
            "maxrss_gib": round(run["maxrss"] / 2**30, 2)}


def measure(args, tool: str, rep: str, out: Path, cmd: list[str], cwd: str) -> dict:
    """Runs one tool's command once the load allows, prints and returns its summary."""
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "0"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    if tool == "studio":
        env["KOHYA_STUDIO_PROGRESS"] = "lines"
    elif args.df_pythonpath:
        env["PYTHONPATH"] = args.df_pythonpath
    load = wait_for_load(args.max_load, args.load_wait)
    run = run_measured(cmd, cwd, env, out.parent / f"{out.name}.log", args.timeout)
    run["load_before"] = load
    result = summarize(run, tool, args.steps)
    print(f"{tool} {rep}: {json.dumps(result)}", flush=True)
    if run["rc"] != 0:
        print("\n".join(text for _, text in run["segments"][-15:]), file=sys.stderr)
    return result


def one_run(args, tool: str, rep: str, model: Path, work: Path,
            example_cmd: Callable[[Path, Path], list[str]]) -> dict:
    """One measured run of ``tool`` on the bench's model (its images and kohya folder under
    ``work``): the example's command from ``example_cmd(images, out)``, else the studio's."""
    out = run_dir(args, tool, rep)
    if tool == "diffusers":
        cmd, cwd = example_cmd(work / "images", out), args.example
    else:
        config = studio_config(model, work / "data", out, args.steps)
        cmd, cwd = studio_cmd(args, config, out), args.studio_root
    return measure(args, tool, rep, out, cmd, cwd)


def rounds(args, one_run: Callable[[str, str], dict]) -> dict[str, list[dict]]:
    """``--reps`` rounds of ``one_run(tool, rep)``, the tools alternated (after one unmeasured
    run of each with ``--warmup``); the results also go to ``WORK/<tag>results.json``."""
    tools = [t for t in TOOLS if t in args.only.split(",")]
    if args.warmup:
        for tool in tools:
            one_run(tool, "warmup")
    done: dict[str, list[dict]] = {t: [] for t in tools}
    for rep in range(args.reps):
        for tool in tools:
            done[tool].append(one_run(tool, str(rep + 1)))
    (Path(args.work) / f"{args.runs_tag}results.json").write_text(json.dumps(done, indent=1))
    return done


def median_of(results: list[dict], key: str):
    values = [r[key] for r in results if r.get(key) is not None and r["rc"] == 0]
    return round(statistics.median(values), 2) if values else None


def report(done: dict[str, list[dict]], args, title: str) -> None:
    """The table of medians and the studio's ratios to the example (``title``: the run's
    model and settings)."""
    keys = ("s_per_step", "cpu_s_per_step", "peak_gib", "step1_s")
    rows = {tool: {k: median_of(done[tool], k) for k in keys} for tool in done}
    print(f"\n{title}, {args.steps} steps; median of "
          f"{args.reps} (runs: {', '.join(f'{t} {len(v)}' for t, v in done.items())})")
    print(f"CPU: {cpu_kind()}; threads (OMP_NUM_THREADS): {args.threads or 'each tool its own'}")
    loads = [r["load"] for runs in done.values() for r in runs if r.get("load") is not None]
    if loads:
        print(f"1-minute load average before the runs: {min(loads)} to {max(loads)}")
    print("| run | s/step | CPU s/step | peak RSS (GiB) | start -> step 1 (s) |\n"
          "|---|---|---|---|---|")
    for tool, row in rows.items():
        label = "diffusers example" if tool == "diffusers" else "studio"
        print(f"| {label} | {row['s_per_step']} | {row['cpu_s_per_step']} | "
              f"{row['peak_gib']} | {row['step1_s']} |")
    if all(t in rows for t in TOOLS):
        for key, name in (("s_per_step", "s/step"), ("cpu_s_per_step", "CPU s/step"),
                          ("peak_gib", "peak RSS"), ("step1_s", "start -> step 1")):
            a, b = rows["studio"][key], rows["diffusers"][key]
            if a and b:
                judged = key in ("s_per_step", "peak_gib")
                goal = f" (target <= {TARGET})" if judged else ""
                mark = (" met" if a / b <= TARGET else " MISSED") if judged else ""
                print(f"studio / example {name}: {a / b:.2f}{goal}{mark}")
