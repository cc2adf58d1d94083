"""The studio's LoRA training against kohya-ss/sd-scripts and diffusers' example, step for step.

    .venv/bin/python bench/compare_peers.py [--reps 3] [--only sd-scripts,diffusers,studio]
        [--models sd15,tiny] [--resolution 64[,256]] [--precision no,auto[,bf16]]
        [--steps 30] [--quick] [--json FILE] [--threads N] [--studio-threads N]
        [--ss-args ARGS] [--df-args ARGS] [--studio-args ARGS]
        [--warmup-steps 4] [--max-load 1.0] [--idle-cores C]
        [--peers-dir DIR] [--peers-scripts DIR] [--work DIR]

Follows the peers' README (``--peers-scripts``, default /work/shared/peers): the peers' code,
venvs, models and data live in ``$PEERS_DIR`` (default /work/peers), outside the checkout. Same
settings for all: the SD 1.5-size model with random weights (then the tiny one), the same 16
images (64 px files, which every tool upscales to ``--resolution`` as it loads them: sd-scripts'
and the studio's one fixed bucket, the example's Resize + CenterCrop), LoRA rank 8 alpha 8 on the
UNet, AdamW 1e-4 constant, batch 1, seed 42.

``--precision`` lists the precisions each tool runs at, one row each: ``no`` (fp32) and ``bf16``
/ ``fp16`` are the peers' ``--mixed_precision`` (their README's PEER_PRECISION) and the studio's
``training.mixed_precision``; ``auto`` is the studio's default, "the studio as installed" (on a
CPU with bf16 units it stores the frozen weights in bf16 where a probe finds that faster), and
has no peer row. ``--only`` takes a tool (every precision) or ``tool:precision``
(``--only sd-scripts,diffusers,studio:auto``). ``--ss-args`` / ``--df-args`` / ``--studio-args``
append arguments to that tool's command line (the studio's: ``--set section.key=value``).

Per model and resolution: one unmeasured warm-up run of each configuration (``--warmup-steps``
steps), then ``--reps`` rounds (the configurations alternated), one run at a time, each started
once the 1-minute load average is under ``--max-load`` (or, with ``--idle-cores``, once the
machine was that idle over 5 s). Every run goes through the README's run_one.sh (/usr/bin/time -v
for wall time and peak RSS, each progress-bar refresh timestamped); s/step is timed from step 10
to the last step. The studio runs as installed, ``python -m trainer train CONFIG.toml``, with no
thread settings forced (``--studio-threads N`` adds runs with OMP_NUM_THREADS=N); its bf16 probe
result is kept in the run folder's ``studio-cache`` (``KOHYA_STUDIO_CACHE``), so the warm-up
measures it and the measured runs reuse it, as a user's second run does. The studio's start-up
is broken down from its log lines (imports, data + model load, bf16 probe, latent cache, text
cache + set-up, first step).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import re
import shlex
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
PRECISIONS = ("no", "bf16", "fp16", "auto")  # auto: the studio's default (no peer has it)


@dataclass(frozen=True)
class Tool:
    key: str  # the name --only takes
    label: str  # the table's row
    prefix: str  # run folder prefix; parse_run.py reads the studio's bar in ks_* folders
    env: dict = field(default_factory=dict)

    @property
    def studio(self) -> bool:
        return self.prefix.startswith("ks_")


SD_SCRIPTS = Tool("sd-scripts", "sd-scripts", "ss_")
DIFFUSERS = Tool("diffusers", "diffusers example", "df_")
STUDIO = Tool("studio", "studio", "ks_")
TOOLS = (SD_SCRIPTS, DIFFUSERS, STUDIO)
# model key -> (folder in $PEERS_DIR, row suffix, the tools that run on it); sd-scripts builds
# its own UNet with SD 1.5's fixed shapes, so it cannot load the tiny model (size mismatches)
MODELS = {
    "sd15": ("sd15-random", "", ("sd-scripts", "diffusers", "studio")),
    "tiny": ("tiny-sd", ", tiny model", ("diffusers", "studio")),
}


@dataclass(frozen=True)
class Variant:
    """One configuration of the table: a tool at a precision."""

    tool: Tool
    precision: str

    @property
    def key(self) -> str:
        return f"{self.tool.key}:{self.precision}"

    @property
    def prefix(self) -> str:  # ks_* stays first: parse_run.py knows the studio by it
        return f"{self.tool.prefix}{self.precision}_"

    @property
    def label(self) -> str:
        if self.tool.studio:
            what = {"auto": "as installed", "no": "fp32 (mixed_precision = no)",
                    "bf16": "bf16 (mixed_precision = bf16)",
                    "fp16": "fp16 (mixed_precision = fp16)"}[self.precision]
            return f"{self.tool.label}, {what}"
        if self.precision == "no":
            return self.tool.label
        return f"{self.tool.label}, {self.precision} (--mixed_precision={self.precision})"


def variants(only: list, precisions: list, tools: tuple = TOOLS) -> list:
    """The configurations ``--only`` and ``--precision`` select, in the table's order (tools as
    listed in TOOLS, then precisions as given); a peer has no ``auto``."""
    picked = set()
    for item in only:
        name, _, precision = item.partition(":")
        for tool in tools:
            if tool.key != name and not (name == "studio" and tool.studio):
                continue
            for p in ([precision] if precision else precisions):
                if p == "auto" and not tool.studio:
                    continue
                picked.add((tool.key, p))
    order = [p for p in precisions] + [p for p in PRECISIONS if p not in precisions]
    return [Variant(tool, p) for tool in tools for p in order if (tool.key, p) in picked]


def studio_config(model: Path, data: Path, out: Path, steps: int, resolution: int = 64,
                  precision: str = "no") -> dict:
    """The README's settings, as the studio's TOML; ``precision = "auto"`` leaves
    training.mixed_precision at the studio's default (as installed). Without buckets every image
    is resized to cover ``resolution`` x ``resolution`` and center-cropped, as the peers do."""
    training = {"train_batch_size": 1, "max_train_steps": steps, "mixed_precision": precision,
                "seed": 42, "log_with": "none"}
    if precision == "auto":
        del training["mixed_precision"]
    return {
        "mode": "lora",
        "model": {"pretrained_model_name_or_path": str(model)},
        "dataset": {"train_data_dir": str(data), "resolution": resolution,
                    "enable_bucket": False, "cache_latents": True},
        "network": {"network_dim": 8, "network_alpha": 8.0, "train_text_encoder": False},
        "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1e-4,
                      "lr_scheduler": "constant"},
        "training": training,
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


def cpu_busy(window: float = 5.0) -> float | None:
    """The whole machine's CPU use over the next ``window`` seconds, in cores (from /proc/stat:
    everything but idle and iowait); None where /proc/stat cannot be read."""
    def sample():
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        return sum(fields) - fields[3] - fields[4], sum(fields)

    try:
        busy0, total0 = sample()
        time.sleep(window)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


def wait_for_quiet(max_load: float, timeout: float, idle_cores: float | None = None) -> bool:
    """Waits until the 1-minute load average is below max_load (the README's rule) or, with
    ``idle_cores``, until the machine used fewer cores than that over 5 s (the load average
    takes about a minute to forget the previous run, even on an idle machine); False (and a
    warning) when it is still busy after timeout seconds."""
    start = time.monotonic()
    while True:
        load = os.getloadavg()[0]
        if load < max_load:
            return True
        if idle_cores is not None:
            busy = cpu_busy()
            if busy is not None and busy < idle_cores:
                return True
        if time.monotonic() - start >= timeout:
            print(f"WARNING: 1-minute load {load:.2f} is still >= {max_load} after "
                  f"{timeout:.0f} s; starting anyway (this run's figures are suspect)",
                  file=sys.stderr)
            return False
        if idle_cores is None:
            time.sleep(5)


def command(variant: Variant, run: Path, model: Path, peers: Path, scripts: Path, steps: int,
            resolution: int, extra: list) -> tuple[list, dict]:
    """The command run_one.sh times and its environment: the peers' own scripts (steps
    replaced, ``extra`` appended, resolution and precision through the README's PEER_RESOLUTION
    / PEER_PRECISION), or the studio with its TOML."""
    out = run / "out"
    if variant.tool.studio:
        config = run / "studio.toml"
        config.write_bytes(tomli_w.dumps(studio_config(
            model, peers / "data", out, steps, resolution, variant.precision)).encode())
        return [str(ROOT / ".venv" / "bin" / "python"), "-m", "trainer", "train", str(config),
                *extra], {}
    name = "cmd_ss.sh" if variant.tool is SD_SCRIPTS else "cmd_df.sh"
    text = (scripts / name).read_text()
    for needed in ("--max_train_steps=30", '--output_dir="$OUT"', "PEER_RESOLUTION",
                   "PEER_PRECISION"):
        if needed not in text:
            raise SystemExit(f"{scripts / name} no longer has {needed}; update "
                             "bench/compare_peers.py")
    text = text.replace("--max_train_steps=30", f"--max_train_steps={steps}")
    if extra:
        text = text.replace('--output_dir="$OUT"',
                            '--output_dir="$OUT" ' + " ".join(shlex.quote(a) for a in extra))
    (run / name).write_text(text)
    env = {"PEER_RESOLUTION": str(resolution), "PEER_PRECISION": variant.precision}
    return ["bash", str(run / name), str(model), str(out)], env


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


# The studio's start-up, from the first log line of each stage (trainer/run/session.py's order);
# a stage whose line is missing (no probe: mixed_precision set; no cache) counts in the next one
STARTUP = (
    ("imports", re.compile(r"Device: ")),  # python, torch, the trainer; the device detected
    ("data + model load", re.compile(r"Base model: ")),  # the dataset scan, diffusers, weights
    ("bf16 probe", re.compile(r"Precision auto: ")),  # auto on a CPU with bf16 units
    # encoded before step 1 ("ready") on a GPU; on the CPU the first epoch encodes as it goes
    ("latent cache", re.compile(r"Latent cache( ready)?: ")),
    ("text cache + set-up", re.compile(r"\d+ images, \d+ with repeats")),  # and the optimizer
    ("first step", None),  # to step 1's bar update
)


def startup(run: Path, step1: float | None) -> dict | None:
    """Seconds of each start-up stage of a studio run, from log.ts (tslog's clock starts with
    the process): {stage: seconds or None}; None without a log."""
    log = run / "log.ts"
    if not log.exists():
        return None
    seen = {}
    for line in log.read_text(errors="replace").splitlines():
        t, _, text = line.split("\t", 2)
        for name, pattern in STARTUP:
            if pattern is not None and name not in seen and pattern.match(text.strip()):
                seen[name] = float(t)
    if step1 is not None:
        seen["first step"] = step1
    out, last = {}, 0.0
    for name, _ in STARTUP:
        if name in seen:
            out[name], last = round(seen[name] - last, 2), seen[name]
        else:
            out[name] = None
    return out


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


def studio_notes(run: Path) -> dict:
    """What the studio's log says it chose: the precision line and the thread count."""
    log = run / "log.ts"
    text = log.read_text(errors="replace") if log.exists() else ""
    precision = re.search(r"\t(Precision auto: [^\n]*)", text)
    threads = re.findall(r"CPU (?:training with|threads:) (\d+) thread", text)
    return {"precision_note": precision.group(1) if precision else None,
            "threads": sorted({int(t) for t in threads}) or None}


def show_failure(run: Path, tail: int = 15) -> None:
    log = run / "log.ts"
    lines = log.read_text(errors="replace").splitlines()[-tail:] if log.exists() else []
    print(f"  {run.name} FAILED; last lines of {log}:", file=sys.stderr)
    for line in lines:
        print("    " + line.split("\t", 2)[-1], file=sys.stderr)


def plan(args, configs: list) -> list:
    """(model, resolution, variant, rep) in the README's order: per model and resolution a
    warm-up round (rep 0, unmeasured), then the measured rounds, the configurations alternated
    within each round."""
    order = []
    for model in args.models:
        for resolution in args.resolution:
            rounds = range(1, args.reps + 1) if args.quick else range(args.reps + 1)
            for rep in rounds:
                order += [(model, resolution, v, rep) for v in configs
                          if ("studio" if v.tool.studio else v.tool.key) in MODELS[model][2]]
    return order


def row_label(variant: Variant, model: str, resolution: int) -> str:
    return f"{variant.label}{MODELS[model][1]}, {resolution} px"


def run_all(args, configs: list, peers: Path, scripts: Path, work: Path) -> list:
    parse_run = load_parse_run(scripts)
    results = []
    env_peers = {"PEERS_DIR": str(peers)}
    if args.threads:  # the same for every tool (the README's rule: say how many)
        env_peers["OMP_NUM_THREADS"] = str(args.threads)
    env_studio = {**env_peers, "HF_HUB_OFFLINE": "1", "TQDM_MININTERVAL": "0",
                  "PYTHONUNBUFFERED": "1", "KOHYA_STUDIO_CACHE": str(args.studio_cache)}
    extra = {"sd-scripts": args.ss_args, "diffusers": args.df_args}
    for model, resolution, variant, rep in plan(args, configs):
        tag = "warmup" if rep == 0 else f"r{rep}"
        run = work / f"{model}_{resolution}px" / f"{variant.prefix}{model}_{tag}"
        run.mkdir(parents=True, exist_ok=True)
        quiet = wait_for_quiet(args.max_load, args.load_timeout, args.idle_cores)
        print(f"[{time.strftime('%H:%M:%S')}] {model} {resolution} px {variant.key} {tag} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        studio = variant.tool.studio
        steps = args.warmup_steps if rep == 0 else args.steps
        cmd, cmd_env = command(variant, run, peers / MODELS[model][0], peers, scripts,
                               steps, resolution,
                               args.studio_args if studio else extra[variant.tool.key])
        env = {**(env_studio if studio else env_peers), **cmd_env, **variant.tool.env}
        run_one(run, ROOT if studio else peers, cmd, env, scripts, args.run_timeout)
        res = {"model": model, "resolution": resolution, "tool": variant.tool.key,
               "precision": variant.precision, "key": variant.key,
               "label": row_label(variant, model, resolution), "rep": rep,
               "run_dir": str(run), "quiet_start": quiet,
               **summarize(run, parse_run, steps)}
        if studio:
            res["startup"] = startup(run, res["step1_s"])
            res.update(studio_notes(run))
        if res["rc"] != 0 or res["s_per_step"] is None:
            show_failure(run)
        else:
            print(f"  s/step {res['s_per_step']:.3f}  peak RSS {res['peak_rss_mib']} MiB  "
                  f"step 1 at {res['step1_s']:.1f} s", flush=True)
            if studio:
                stages = ", ".join(f"{k} {v:.1f}" for k, v in res["startup"].items()
                                   if v is not None)
                print(f"  start-up (s): {stages}; threads {res['threads']}"
                      + (f"; {res['precision_note']}" if res["precision_note"] else ""),
                      flush=True)
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
        row = rows.setdefault(res["label"], {
            "run": res["label"], "model": res["model"], "resolution": res.get("resolution"),
            "tool": res["tool"], "precision": res.get("precision", "no"), "reps": 0,
            "failed": 0, "_runs": []})
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
        stages = [r["startup"] for r in runs if r.get("startup")]
        if stages:
            row["startup"] = {name: median([s.get(name) for s in stages])
                              for name, _ in STARTUP}
    return list(rows.values())


def _name(row: dict) -> str:
    return row["tool"] if row["precision"] in ("no", "auto") else \
        f"{row['tool']} {row['precision']}"


def ratios(rows: list) -> dict:
    """Each studio row against each peer row of the same model and resolution: s/step and
    start -> step 1, studio / peer (below 1: the studio is faster)."""
    out = {}
    for studio in [r for r in rows if r["tool"].startswith("studio")]:
        for peer in rows:
            if peer["tool"].startswith("studio") or \
                    (peer["model"], peer.get("resolution")) != \
                    (studio["model"], studio.get("resolution")):
                continue
            where = f"{studio['model']} {studio.get('resolution')} px"
            who = f"studio {studio['precision']} / {_name(peer)}"
            for what, key in (("s/step", "s_per_step"), ("start -> step 1", "step1_s")):
                if studio[key] and peer[key]:
                    out[f"{where}: {who} {what}"] = round(studio[key] / peer[key], 3)
    return out


# issue 20's goals on a CPU with bf16 units: (model, resolution, studio, peer, measure, at most)
GOALS = (
    ("sd15", 256, "studio:auto", "sd-scripts:no", "s_per_step", 0.45),
    ("sd15", 256, "studio:auto", "sd-scripts:bf16", "s_per_step", 0.55),
    ("sd15", None, "studio:auto", "diffusers:no", "step1_s", 0.6),
)


def goals(rows: list) -> list:
    """The goals whose rows ran: (text, ratio, met)."""
    by = {(r["model"], r.get("resolution"), f"{r['tool']}:{r['precision']}"): r for r in rows}
    out = []
    for model, resolution, studio, peer, key, limit in GOALS:
        for res in sorted({r.get("resolution") for r in rows}):
            if resolution not in (None, res):
                continue
            a, b = by.get((model, res, studio)), by.get((model, res, peer))
            if a and b and a[key] and b[key]:
                what = "s/step" if key == "s_per_step" else "start -> step 1"
                ratio = a[key] / b[key]
                out.append((f"{model} {res} px: {studio} / {peer} {what} = {ratio:.3f} "
                            f"(goal <= {limit})", round(ratio, 3), ratio <= limit))
    return out


def print_table(rows: list, ratio: dict, args) -> None:
    def fmt(value, spec, unit=""):
        return "-" if value is None else f"{value:{spec}}{unit}"

    threads = (f"OMP_NUM_THREADS={args.threads} for every tool" if args.threads else
               "the peers use torch's default, the studio its own (as installed); "
               f"OMP_NUM_THREADS in this environment: "
               f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"\n{os.cpu_count()} cores; threads: {threads}; 1-minute load now "
          f"{os.getloadavg()[0]:.2f}")
    print(f"median of {args.reps} rep(s), s/step from step {min(STEP_FROM, args.steps // 2)} "
          f"to {args.steps}\n")
    print("| precision | run | s/step | peak RSS | start -> step 1 done | reps (failed) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        rss = None if r["peak_rss_mib"] is None else r["peak_rss_mib"] / 1024
        precision = {"no": "fp32"}.get(r["precision"], r["precision"])
        print(f"| {precision} | {r['run']} | {fmt(r['s_per_step'], '.3f')} | "
              f"{fmt(rss, '.1f', ' GiB')} | {fmt(r['step1_s'], '.1f', ' s')} | "
              f"{r['reps']} ({r['failed']}) |")
    startups = [r for r in rows if r.get("startup")]
    if startups:
        print("\nThe studio's start-up (s, median; from its log lines):\n")
        print("| run | " + " | ".join(name for name, _ in STARTUP) + " | start -> step 1 |")
        print("|---|" + "---|" * (len(STARTUP) + 1))
        for r in startups:
            print(f"| {r['run']} | " + " | ".join(fmt(r["startup"][name], ".1f")
                                                  for name, _ in STARTUP)
                  + f" | {fmt(r['step1_s'], '.1f')} |")
    print("\nstudio / peer (below 1 = the studio is faster):")
    pairs = {}
    for name, value in ratio.items():
        for what in (" s/step", " start -> step 1"):
            if name.endswith(what):
                pairs.setdefault(name[:-len(what)], []).append(f"{what.strip()} {value:.3f}")
    for name, values in pairs.items():
        print(f"  {name}: {', '.join(values)}")
    for text, _, met in goals(rows):
        print(f"GOAL {'met' if met else 'MISSED'}: {text}")
    print("Differences under about 10% are noise on these machines.")


def _list(text: str) -> list:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3, help="measured repetitions per configuration")
    p.add_argument("--only", default="sd-scripts,diffusers,studio",
                   help="comma-separated tools (sd-scripts, diffusers, studio), each at every "
                   "--precision, or tool:precision (e.g. studio:auto)")
    p.add_argument("--models", default="sd15,tiny", help="comma-separated: sd15, tiny")
    p.add_argument("--resolution", default="64",
                   help="comma-separated resolutions in px (e.g. 64,256; multiples of 8)")
    p.add_argument("--precision", default="no,auto",
                   help="comma-separated: no (fp32), bf16, fp16, auto (the studio's default: "
                   "as installed; no peer row)")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (>= 4)")
    p.add_argument("--warmup-steps", type=int, help="steps of the unmeasured warm-up runs "
                   "(default 4: they only fill the page cache and the studio's probe cache)")
    p.add_argument("--ss-args", default="", help="extra arguments for sd-scripts' "
                   "train_network.py (one string, shell words)")
    p.add_argument("--df-args", default="", help="extra arguments for the diffusers example")
    p.add_argument("--studio-args", default="", help="extra arguments for the studio's train "
                   "command, e.g. '--set training.full_bf16=true'")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 rep, no warm-up, no waiting for a quiet machine")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    p.add_argument("--studio-threads", type=int, help="also run the studio with OMP_NUM_THREADS")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every tool (default: "
                   "unset, each tool's own choice; 1 keeps a smoke run on a busy machine from "
                   "spinning)")
    p.add_argument("--studio-cache", type=Path, help="KOHYA_STUDIO_CACHE for the studio's runs "
                   "(its bf16 probe results; default: a new folder in --work)")
    p.add_argument("--peers-dir", type=Path,
                   default=Path(os.environ.get("PEERS_DIR", "/work/peers")))
    p.add_argument("--peers-scripts", type=Path, default=Path("/work/shared/peers"))
    p.add_argument("--work", type=Path, help="folder for the runs' logs (default: a new temp)")
    p.add_argument("--max-load", type=float, default=1.0, help="start each run once the "
                   "1-minute load average is below this (the README's rule)")
    p.add_argument("--idle-cores", type=float, help="... or once the machine used fewer cores "
                   "than this over 5 s (e.g. 0.2): the load average needs about a minute to "
                   "forget the previous run even on an idle machine")
    p.add_argument("--load-timeout", type=float, help="seconds to wait for --max-load "
                   "(default 900; 0 with --quick)")
    p.add_argument("--run-timeout", type=float, default=1800, help="seconds one run may take")
    args = p.parse_args(argv)
    args.only, args.models = _list(args.only), _list(args.models)
    args.precision = _list(args.precision)
    try:
        args.resolution = [int(r) for r in _list(args.resolution)]
    except ValueError:
        p.error(f"--resolution takes whole numbers: {args.resolution!r}")
    bad = ([t for t in args.only if t.partition(":")[0] not in {t.key for t in TOOLS}
            or t.partition(":")[2] not in ("", *PRECISIONS)]
           + [m for m in args.models if m not in MODELS]
           + [q for q in args.precision if q not in PRECISIONS]
           + [r for r in args.resolution if r < 8 or r % 8])
    if args.warmup_steps is None:
        args.warmup_steps = min(4, args.steps)
    if bad or min(args.steps, args.warmup_steps) < 4 or args.reps < 1:
        p.error(f"unknown tool/model/precision/resolution {bad}" if bad
                else "--steps and --warmup-steps must be >= 4, --reps >= 1")
    for name in ("ss_args", "df_args", "studio_args"):
        setattr(args, name, shlex.split(getattr(args, name)))
    if args.quick:
        args.reps = 1
    if args.load_timeout is None:
        args.load_timeout = 0.0 if args.quick else 900.0
    return args


def _stop(signum, _frame):
    """SIGTERM / SIGHUP end the bench as Ctrl-C does: the run in progress (its process group)
    is stopped before this process exits, so no training outlives it."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with '&'
    peers, scripts = args.peers_dir.resolve(), args.peers_scripts.resolve()
    tools = TOOLS
    if args.studio_threads:
        tools += (Tool("studio-threads", f"studio, OMP_NUM_THREADS={args.studio_threads}",
                       "ks_t_", {"OMP_NUM_THREADS": str(args.studio_threads)}),)
    configs = variants(args.only, args.precision, tools)
    if not configs:
        print("--only and --precision select no configuration", file=sys.stderr)
        return 2
    missing = missing_setup(peers, scripts, {("studio" if v.tool.studio else v.tool.key)
                                             for v in configs}, args.models)
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
    args.studio_cache = (args.studio_cache or work / "studio-cache").resolve()
    print(f"runs in {work}; {len(plan(args, configs))} runs: "
          f"{', '.join(v.key for v in configs)} at {args.resolution} px", flush=True)
    results = run_all(args, configs, peers, scripts, work)
    rows = summary_rows(results)
    ratio = ratios(rows)
    print_table(rows, ratio, args)
    if args.json:
        args.json.write_text(json.dumps({
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "cores": os.cpu_count(), "load_end": os.getloadavg(), "runs": results,
            "summary": rows, "ratios": ratio,
            "goals": [{"goal": t, "ratio": r, "met": m} for t, r, m in goals(rows)],
        }, indent=2))
    return 0 if all(r["failed"] == 0 for r in rows) and rows else 1


if __name__ == "__main__":
    sys.exit(main())
