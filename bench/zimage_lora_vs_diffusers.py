"""A Z-Image LoRA at 256 px: the studio against diffusers' own example
(``examples/dreambooth/train_dreambooth_lora_z_image.py``), same model, images and settings.

    .venv/bin/python bench/zimage_lora_vs_diffusers.py --example DIR [--df-python PY]
        [--work /tmp/zbench] [--reps 3] [--steps 6] [--only diffusers,studio]

The model and images are bench/zimage_model.py's (built into ``WORK/z`` if missing): a Z-Image
at real width (dim 3840, Qwen3 width 2560) with a few blocks and random weights. The example's
code is not the project's: take it from a diffusers snapshot into a folder outside the checkout
(``--example``: the folder holding the script) and run it with a Python that has diffusers,
transformers, accelerate, peft and torchvision (``--df-python``; default: this venv's). Where
torchvision has no wheel (no CPU build for the box), ``--df-python`` may be a wrapper around this
venv's Python that imports transformers and diffusers first (so that they cache "no
torchvision" and use none themselves), then puts a stand-in on ``sys.path`` with the calls the
example makes (``transforms.InterpolationMode``, ``RandomCrop.get_params``; ``functional``'s
``resize``, ``center_crop``, ``crop``, ``hflip``, ``to_tensor``, ``normalize`` on PIL images)
and runs the script with ``runpy``: the example's step, its models and its memory are
untouched (only its image preprocessing goes through the stand-in).

Same for both: LoRA rank 4 alpha 4 (the example's defaults) on the transformer only, AdamW,
lr 1e-4 constant, no warm-up, batch 1, 256 px (one square size, no buckets), ``--steps``
steps, seed 42, fp32 (``--mixed_precision no`` / ``training.mixed_precision = "no"``), one
caption for every image (the example's ``--instance_prompt``). Each tool caches what it caches
by default: the example encodes the prompt once and runs the VAE at every step (no
``--cache_latents``); the studio caches the text and the latents (encoded as epoch 1 reaches
each image). Their targets differ where neither can be told to match: the example trains the
attention (to_q, to_k, to_v, to_out.0) of every block, refiners included; the studio its
family's (musubi-tuner's: attention and SwiGLU of the main layers), so its backward pass stops
at the main layers, where the example's goes on through the refiners: at the bench's depth
(one main layer, two refiners) that is a large share of a step, at the real depth (30 and 4)
a small one. Both encode each image with the VAE at every step of the bench's 5 (the studio's
latent cache fills as epoch 1 reaches each of the 6 images): the FLUX.1 autoencoder's encoder
at 256 px is 0.27 TFLOP, more than the transformer's forward at the default depth (0.20), and
the same in both, so it bounds how far apart the two steps can be. ``--studio-root`` runs
another checkout's trainer/ (e.g. a fix, against the same example figures).

``--reps`` rounds, the tools alternated, one run at a time, each started once the 1-minute load
average is under ``--max-load`` (or after ``--load-wait`` seconds, noted). For each run: s/step
is the median of the steps after the first (from each tool's progress output, timestamped
here as it arrives); CPU s/step the median of the CPU seconds (user + system, every thread)
its process tree spent over the same steps, which other work on the machine stretches far
less than the wall-clock seconds (a figure to read beside s/step on a shared machine);
start -> step 1 is from launch to step 1's progress update; peak RSS is the largest sum of
the RSS of the process and its descendants (polled every 0.1 s), or the process's own peak
(``wait4``'s maxrss) where that is larger. The table gives the median of
the rounds and the studio's ratios to the example.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import tomli_w
from zimage_procs import cpu_at, cpu_kind, run_measured, wait_for_load

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "train_dreambooth_lora_z_image.py"
TOOLS = ("diffusers", "studio")
STEP_RE = {"diffusers": r"\s*Steps:\s+\d+%\|.*?\|\s*(\d+)/{n} \[",
           "studio": r"\s*(\d+)/{n} \(\d+%\)"}
TARGET = 0.8


def example_cmd(args, model: Path, data: Path, out: Path) -> list[str]:
    from zimage_model import CAPTION

    return [args.df_python, str(Path(args.example) / EXAMPLE),
            f"--pretrained_model_name_or_path={model}", f"--instance_data_dir={data}",
            f"--instance_prompt={CAPTION}", "--resolution=256", "--rank=4", "--lora_alpha=4",
            "--train_batch_size=1", f"--max_train_steps={args.steps}",
            "--learning_rate=1e-4", "--lr_scheduler=constant", "--lr_warmup_steps=0",
            "--seed=42", "--mixed_precision=no", "--dataloader_num_workers=0",
            "--checkpointing_steps=100000", f"--output_dir={out}", *args.df_args]


def studio_config(model: Path, data: Path, out: Path, steps: int) -> dict:
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


def studio_cmd(args, model: Path, data: Path, out: Path) -> list[str]:
    config = out.parent / f"{out.name}.toml"
    config.write_text(tomli_w.dumps(studio_config(model, data, out, args.steps)))
    return [str(ROOT / ".venv/bin/python"), "-m", "trainer", "train", str(config),
            *args.studio_args]  # run in --studio-root: its trainer/ is the one imported


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
    cpu = [cpu_at(run["cpu"], b) - cpu_at(run["cpu"], a) for a, b in pairs
           if cpu_at(run["cpu"], a) is not None]
    return {"rc": run["rc"], "wall_s": round(run["wall_s"], 1), "load": run["load_before"],
            "step1_s": round(first[1], 1) if 1 in first else None,
            "s_per_step": round(statistics.median(singles), 2) if singles else None,
            "cpu_s_per_step": round(statistics.median(cpu), 2) if cpu else None,
            "steps": [round(s, 2) for s in singles],
            "peak_gib": round(max(run["tree_peak"], run["maxrss"]) / 2**30, 2),
            "tree_peak_gib": round(run["tree_peak"] / 2**30, 2),
            "maxrss_gib": round(run["maxrss"] / 2**30, 2)}


def one_run(args, tool: str, rep: str, model: Path) -> dict:
    work = Path(args.work)
    out = work / "runs" / f"{args.runs_tag}{tool}_{rep}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "0"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    if tool == "diffusers":
        cmd, cwd = example_cmd(args, model, work / "z" / "images", out), args.example
    else:
        cmd, cwd = studio_cmd(args, model, work / "z" / "data", out), args.studio_root
        env["KOHYA_STUDIO_PROGRESS"] = "lines"
    load = wait_for_load(args.max_load, args.load_wait)
    run = run_measured(cmd, cwd, env, out.parent / f"{out.name}.log", args.timeout)
    run["load_before"] = load
    result = summarize(run, tool, args.steps)
    print(f"{tool} {rep}: {json.dumps(result)}", flush=True)
    if run["rc"] != 0:
        print("\n".join(text for _, text in run["segments"][-15:]), file=sys.stderr)
    return result


def median_of(results: list[dict], key: str):
    values = [r[key] for r in results if r.get(key) is not None and r["rc"] == 0]
    return round(statistics.median(values), 2) if values else None


def report(done: dict[str, list[dict]], args) -> None:
    keys = ("s_per_step", "cpu_s_per_step", "peak_gib", "step1_s")
    rows = {tool: {k: median_of(done[tool], k) for k in keys} for tool in done}
    print(f"\nZ-Image LoRA, 256 px, fp32, batch 1, {args.steps} steps; median of "
          f"{args.reps} (runs: {', '.join(f'{t} {len(v)}' for t, v in done.items())})")
    print(f"CPU: {cpu_kind()}; threads (OMP_NUM_THREADS): {args.threads or 'each tool its own'}")
    loads = [r["load"] for runs in done.values() for r in runs]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", required=True, help=f"the folder holding {EXAMPLE}")
    parser.add_argument("--df-python", default=sys.executable)
    parser.add_argument("--work", default="/tmp/zbench")
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
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--refiners", type=int, default=1)
    parser.add_argument("--te-layers", type=int, default=2)
    args = parser.parse_args()
    tools = [t for t in TOOLS if t in args.only.split(",")]
    model = Path(args.work) / "z" / "model"
    if not (model / "model_index.json").exists():
        from zimage_model import build_images, build_model

        build_model(model, args.layers, args.refiners, args.te_layers)
        build_images(model.parent)
    layers = json.loads((model / "transformer/config.json").read_text())["n_layers"]
    print(f"model: {model} ({layers} layers); CPU: {cpu_kind()}; "
          f"threads: {args.threads or 'each tool its own'}")
    if args.warmup:
        for tool in tools:
            one_run(args, tool, "warmup", model)
    done: dict[str, list[dict]] = {t: [] for t in tools}
    for rep in range(args.reps):
        for tool in tools:
            done[tool].append(one_run(args, tool, str(rep + 1), model))
    (Path(args.work) / f"{args.runs_tag}results.json").write_text(json.dumps(done, indent=1))
    report(done, args)


if __name__ == "__main__":
    main()
