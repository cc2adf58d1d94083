"""The studio's LoRA training against kohya-ss/sd-scripts and diffusers' example, step for step.

    .venv/bin/python bench/compare_peers.py [--reps 3] [--only sd-scripts,diffusers,studio]
        [--models sd15,tiny] [--steps 30] [--quick] [--json FILE] [--studio-threads N]
        [--peers-dir DIR] [--peers-scripts DIR] [--work DIR]

Follows the peers' README (``--peers-scripts``, default /work/shared/peers): the peers' code,
venvs, models and data live in ``$PEERS_DIR`` (default /work/peers), outside the checkout. Same
settings for all: the SD 1.5-size model with random weights (then the tiny one), the same 16
images, 64 px, LoRA rank 8 alpha 8 on the UNet, AdamW 1e-4 constant, batch 1, fp32, seed 42.
Per model: one unmeasured warm-up run of each tool, then ``--reps`` rounds (sd-scripts, diffusers,
studio), one run at a time, each started once the 1-minute load average is under ``--max-load``.
Every run goes through the README's run_one.sh (/usr/bin/time -v for wall time and peak RSS,
each progress-bar refresh timestamped); s/step is timed from step 10 to the last step. The
studio runs as installed, ``python -m trainer train CONFIG.toml``, with no thread settings forced
(``--studio-threads N`` adds runs with OMP_NUM_THREADS=N).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
STEP_FROM = 10  # the first steps (compilation, allocator warm-up) are not timed


@dataclass(frozen=True)
class Tool:
    key: str  # the name --only takes
    label: str  # the table's row
    prefix: str  # run folder prefix; parse_run.py reads the studio's bar in ks_* folders
    env: dict = field(default_factory=dict)


SD_SCRIPTS = Tool("sd-scripts", "sd-scripts", "ss_")
DIFFUSERS = Tool("diffusers", "diffusers example", "df_")
STUDIO = Tool("studio", "studio, as installed", "ks_")
TOOLS = (SD_SCRIPTS, DIFFUSERS, STUDIO)
# model key -> (folder in $PEERS_DIR, row suffix, the tools that run on it); sd-scripts builds
# its own UNet with SD 1.5's fixed shapes, so it cannot load the tiny model (size mismatches)
MODELS = {
    "sd15": ("sd15-random", "", ("sd-scripts", "diffusers", "studio")),
    "tiny": ("tiny-sd", ", tiny model", ("diffusers", "studio")),
}


def studio_config(model: Path, data: Path, out: Path, steps: int) -> dict:
    """The README's settings, as the studio's TOML."""
    return {
        "mode": "lora",
        "model": {"pretrained_model_name_or_path": str(model)},
        "dataset": {"train_data_dir": str(data), "resolution": 64, "enable_bucket": False,
                    "cache_latents": True},
        "network": {"network_dim": 8, "network_alpha": 8.0, "train_text_encoder": False},
        "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1e-4,
                      "lr_scheduler": "constant"},
        "training": {"train_batch_size": 1, "max_train_steps": steps, "mixed_precision": "no",
                     "seed": 42, "log_with": "none"},
        "saving": {"output_dir": str(out), "save_precision": "fp32"},
    }


def missing_setup(peers: Path, scripts: Path, tools: set, models: list) -> list:
    """What the README's set-up lacks, as 'path (README step)' lines."""
    need = [(scripts / name, f"--peers-scripts: the README's folder ({name})")
            for name in ("run_one.sh", "tslog.py", "parse_run.py", "cmd_ss.sh", "cmd_df.sh")]
    need += [(peers / "scripts" / "tslog.py", "run_one.sh reads $PEERS_DIR/scripts/tslog.py: "
              f"mkdir -p {peers}/scripts && cp {scripts}/* {peers}/scripts/"),
             (Path("/usr/bin/time"), "GNU time: apt-get install time")]
    if "sd-scripts" in tools:
        need += [(peers / "sd-scripts" / "train_network.py", "README step 1"),
                 (peers / "venv-ss" / "bin" / "python", "README step 2"),
                 (peers / "tokcache" / "openai_clip-vit-large-patch14", "README step 3"),
                 (peers / "data" / "10_shapes", "README step 3 (make_dataset.py)")]
    if "diffusers" in tools:
        need += [(peers / "diffusers-src/examples/text_to_image/train_text_to_image_lora.py",
                  "README step 1"), (peers / "venv-df" / "bin" / "python", "README step 2"),
                 (peers / "data-df" / "shapes" / "metadata.jsonl",
                  "README step 3 (make_dataset.py)")]
    if "studio" in tools:
        need += [(ROOT / ".venv" / "bin" / "python", "the studio's venv: ./setup.sh"),
                 (peers / "data" / "10_shapes", "README step 3 (make_dataset.py)")]
    need += [(peers / MODELS[m][0] / "model_index.json",
              "README step 3 (" + ("build_sd15_random.py" if m == "sd15" else "build_tiny_sd.py")
              + ")") for m in models]
    seen, lines = set(), []
    for path, step in need:
        if not path.exists() and path not in seen:
            seen.add(path)
            lines.append(f"{path} ({step})")
    return lines


def wait_for_quiet(max_load: float, timeout: float) -> bool:
    """Waits until the 1-minute load average is below max_load; False (and a warning) when it
    is still above after timeout seconds."""
    start = time.monotonic()
    while (load := os.getloadavg()[0]) >= max_load:
        if time.monotonic() - start >= timeout:
            print(f"WARNING: 1-minute load {load:.2f} is still >= {max_load} after "
                  f"{timeout:.0f} s; starting anyway (this run's figures are suspect)",
                  file=sys.stderr)
            return False
        time.sleep(5)
    return True


def command(tool: Tool, run: Path, model: Path, peers: Path, scripts: Path, steps: int) -> list:
    """The command run_one.sh times: the peers' own scripts (steps replaced), or the studio."""
    out = run / "out"
    if tool.prefix.startswith("ks_"):
        config = run / "studio.toml"
        config.write_bytes(tomli_w.dumps(studio_config(model, peers / "data", out, steps))
                           .encode())
        return [str(ROOT / ".venv" / "bin" / "python"), "-m", "trainer", "train", str(config)]
    name = "cmd_ss.sh" if tool is SD_SCRIPTS else "cmd_df.sh"
    text = (scripts / name).read_text()
    if "--max_train_steps=30" not in text:
        raise SystemExit(f"{scripts / name} no longer has --max_train_steps=30; update "
                         "bench/compare_peers.py")
    (run / name).write_text(text.replace("--max_train_steps=30", f"--max_train_steps={steps}"))
    return ["bash", str(run / name), str(model), str(out)]


def run_one(run: Path, workdir: Path, cmd: list, env: dict, scripts: Path, timeout: float) -> None:
    """One run under the README's run_one.sh, in its own process group (killed on timeout or
    Ctrl-C, so that no run outlives this script and no two runs overlap)."""
    proc = subprocess.Popen(["bash", str(scripts / "run_one.sh"), str(run), str(workdir), "--",
                             *cmd], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except BaseException as exc:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        print(f"WARNING: {run.name} ran past {timeout:.0f} s and was stopped", file=sys.stderr)


def load_parse_run(scripts: Path):
    spec = importlib.util.spec_from_file_location("parse_run", scripts / "parse_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summarize(run: Path, parse_run, steps: int) -> dict:
    """Wall time, peak RSS, exit status, step 1 and s/step of one run (parse_run.py's way)."""
    # parse_run.py knows the studio's bar by its total; follow --steps
    parse_run.KS = re.compile(rf"\s*\d+%\|.*?\|\s*(\d+)/({steps}) \[")
    first = parse_run.step_times(str(run))[0] if (run / "log.ts").exists() else {}
    timing = (run / "time.txt").read_text() if (run / "time.txt").exists() else ""
    info = (run / "info.txt").read_text() if (run / "info.txt").exists() else ""
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", timing)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing)
    rc = re.search(r"^rc: (\d+)", info, re.M)
    load = re.search(r"load average: ([\d.]+)", info)
    a = min(STEP_FROM, steps // 2)
    return {
        "rc": int(rc.group(1)) if rc else None,
        "wall_s": sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall.group(1).split(":"))))
        if wall else None,
        "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
        "load_before": float(load.group(1)) if load else None,
        "step1_s": first.get(1), "steps_seen": len(first), "timed_steps": [a, steps],
        "s_per_step": round((first[steps] - first[a]) / (steps - a), 4)
        if a in first and steps in first else None,
    }


def show_failure(run: Path, tail: int = 15) -> None:
    log = run / "log.ts"
    lines = log.read_text(errors="replace").splitlines()[-tail:] if log.exists() else []
    print(f"  {run.name} FAILED; last lines of {log}:", file=sys.stderr)
    for line in lines:
        print("    " + line.split("\t", 2)[-1], file=sys.stderr)


def plan(args, tools: tuple) -> list:
    """(model, tool, rep) in the README's order: per model a warm-up round (rep 0, unmeasured),
    then the measured rounds, the tools alternated within each round."""
    order = []
    for model in args.models:
        rounds = range(1, args.reps + 1) if args.quick else range(args.reps + 1)
        for rep in rounds:
            order += [(model, tool, rep) for tool in tools
                      if tool.key.split(":")[0] in MODELS[model][2]]
    return order


def run_all(args, tools: tuple, peers: Path, scripts: Path, work: Path) -> list:
    parse_run = load_parse_run(scripts)
    results = []
    env_peers = {"PEERS_DIR": str(peers)}
    env_studio = {**env_peers, "HF_HUB_OFFLINE": "1", "TQDM_MININTERVAL": "0",
                  "PYTHONUNBUFFERED": "1"}
    for model, tool, rep in plan(args, tools):
        tag = "warmup" if rep == 0 else f"r{rep}"
        run = work / model / f"{tool.prefix}{model}_{tag}"
        run.mkdir(parents=True, exist_ok=True)
        quiet = wait_for_quiet(args.max_load, args.load_timeout)
        print(f"[{time.strftime('%H:%M:%S')}] {model} {tool.key} {tag} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        cmd = command(tool, run, peers / MODELS[model][0], peers, scripts, args.steps)
        is_studio = tool.prefix.startswith("ks_")
        env = {**(env_studio if is_studio else env_peers), **tool.env}
        run_one(run, ROOT if is_studio else peers, cmd, env, scripts, args.run_timeout)
        res = {"model": model, "tool": tool.key, "label": tool.label + MODELS[model][1],
               "rep": rep, "run_dir": str(run), "quiet_start": quiet,
               **summarize(run, parse_run, args.steps)}
        if res["rc"] != 0 or res["s_per_step"] is None:
            show_failure(run)
        else:
            print(f"  s/step {res['s_per_step']:.3f}  peak RSS {res['peak_rss_mib']} MiB  "
                  f"step 1 at {res['step1_s']:.1f} s", flush=True)
        results.append(res)
    return results


def median(values: list):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summary_rows(results: list) -> list:
    rows = {}
    for res in results:
        if res["rep"] == 0:
            continue
        row = rows.setdefault(res["label"], {"run": res["label"], "model": res["model"],
                                             "tool": res["tool"], "reps": 0, "failed": 0,
                                             "_runs": []})
        ok = res["rc"] == 0 and res["s_per_step"] is not None
        row["reps" if ok else "failed"] += 1
        if ok:
            row["_runs"].append(res)
    for row in rows.values():
        runs = row.pop("_runs")
        row["s_per_step"] = median([r["s_per_step"] for r in runs])
        row["s_per_step_min_max"] = ([min(r["s_per_step"] for r in runs),
                                      max(r["s_per_step"] for r in runs)] if runs else None)
        row["peak_rss_mib"] = median([r["peak_rss_mib"] for r in runs])
        row["step1_s"] = median([r["step1_s"] for r in runs])
    return list(rows.values())


def ratios(rows: list) -> dict:
    """studio / sd-scripts s/step (below 1: the studio is faster) and studio vs diffusers
    steps/s (above 1: the studio is faster), per model."""
    by = {(r["model"], r["tool"]): r["s_per_step"] for r in rows if r["s_per_step"]}
    out = {}
    for model in MODELS:
        for tool in [t for (m, t) in by if m == model and t.startswith("studio")]:
            studio = by[(model, tool)]
            if (model, "sd-scripts") in by:
                out[f"{model}: {tool} / sd-scripts s/step"] = round(
                    studio / by[(model, "sd-scripts")], 3)
            if (model, "diffusers") in by:
                out[f"{model}: {tool} / diffusers steps/s"] = round(
                    by[(model, "diffusers")] / studio, 3)
    return out


def print_table(rows: list, ratio: dict, args) -> None:
    def fmt(value, spec, unit=""):
        return "-" if value is None else f"{value:{spec}}{unit}"

    print(f"\n{os.cpu_count()} cores; threads: the peers use torch's default, the studio its own "
          f"(as installed); OMP_NUM_THREADS in this environment: "
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"median of {args.reps} rep(s), s/step from step {min(STEP_FROM, args.steps // 2)} "
          f"to {args.steps}\n")
    print("| run | s/step | peak RSS | start -> step 1 done | reps (failed) |")
    print("|---|---|---|---|---|")
    for r in rows:
        rss = None if r["peak_rss_mib"] is None else r["peak_rss_mib"] / 1024
        print(f"| {r['run']} | {fmt(r['s_per_step'], '.3f')} | {fmt(rss, '.1f', ' GiB')} | "
              f"{fmt(r['step1_s'], '.1f', ' s')} | {r['reps']} ({r['failed']}) |")
    print()
    for name, value in ratio.items():
        better = "below" if name.endswith("s/step") else "above"
        print(f"{name}: {value:.3f} ({better} 1 = the studio is faster)")
    print("Differences under about 10% are noise on these machines.")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3, help="measured repetitions per tool")
    p.add_argument("--only", default="sd-scripts,diffusers,studio",
                   help="comma-separated tools: sd-scripts, diffusers, studio")
    p.add_argument("--models", default="sd15,tiny", help="comma-separated: sd15, tiny")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (>= 4)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 rep, no warm-up, no waiting for a quiet machine")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    p.add_argument("--studio-threads", type=int, help="also run the studio with OMP_NUM_THREADS")
    p.add_argument("--peers-dir", type=Path,
                   default=Path(os.environ.get("PEERS_DIR", "/work/peers")))
    p.add_argument("--peers-scripts", type=Path, default=Path("/work/shared/peers"))
    p.add_argument("--work", type=Path, help="folder for the runs' logs (default: a new temp)")
    p.add_argument("--max-load", type=float, default=1.0)
    p.add_argument("--load-timeout", type=float, help="seconds to wait for --max-load "
                   "(default 900; 0 with --quick)")
    p.add_argument("--run-timeout", type=float, default=1800, help="seconds one run may take")
    args = p.parse_args(argv)
    args.only = [t.strip() for t in args.only.split(",") if t.strip()]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = ([t for t in args.only if t not in {t.key for t in TOOLS}]
           + [m for m in args.models if m not in MODELS])
    if bad or args.steps < 4 or args.reps < 1:
        p.error(f"unknown tool/model {bad}" if bad else "--steps must be >= 4, --reps >= 1")
    if args.quick:
        args.reps = 1
    if args.load_timeout is None:
        args.load_timeout = 0.0 if args.quick else 900.0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    peers, scripts = args.peers_dir.resolve(), args.peers_scripts.resolve()
    tools = tuple(t for t in TOOLS if t.key in args.only)
    if args.studio_threads and "studio" in args.only:
        tools += (Tool("studio:threads", f"studio, OMP_NUM_THREADS={args.studio_threads}", "ks_t_",
                       {"OMP_NUM_THREADS": str(args.studio_threads)}),)
    missing = missing_setup(peers, scripts, set(args.only), args.models)
    if missing:
        print("The peers' set-up is incomplete (see " + str(scripts / "README.md") + "):\n  "
              + "\n  ".join(missing), file=sys.stderr)
        return 2
    lock = open(peers / ".compare_peers.lock", "w")  # held (locked) until this process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another compare_peers run is using {peers}; runs must not overlap",
              file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="compare-peers-"))
    print(f"runs in {work}; {len(plan(args, tools))} runs", flush=True)
    results = run_all(args, tools, peers, scripts, work)
    rows = summary_rows(results)
    ratio = ratios(rows)
    print_table(rows, ratio, args)
    if args.json:
        args.json.write_text(json.dumps({
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "cores": os.cpu_count(), "runs": results, "summary": rows, "ratios": ratio,
        }, indent=2))
    return 0 if all(r["failed"] == 0 for r in rows) and rows else 1


if __name__ == "__main__":
    sys.exit(main())
