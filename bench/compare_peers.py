"""The studio's LoRA training against kohya-ss/sd-scripts and diffusers' example, step for step.

    .venv/bin/python bench/compare_peers.py [--reps 3] [--only ...] [--models ...] [--quick]

(``--help`` lists the rest: steps, threads, each tool's extra arguments, load limits, folders.)

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
measures it and the measured runs reuse it, as a user's second run does; its start-up is broken
down from its log lines.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w
from peer_report import (
    goals,
    print_table,
    ratios,
    show_failure,
    startup,
    studio_notes,
    summarize,
    summary_rows,
)
from peer_runs import load_parse_run, run_one, wait_for_quiet

ROOT = Path(__file__).resolve().parent.parent
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
MODELS = {"sd15": ("sd15-random", "", ("sd-scripts", "diffusers", "studio")),
          "tiny": ("tiny-sd", ", tiny model", ("diffusers", "studio"))}


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
            p = self.precision
            what = "as installed" if p == "auto" else \
                f"{'fp32' if p == 'no' else p} (mixed_precision = {p})"
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
                  "KOHYA_STUDIO_PROGRESS": "bar", "PYTHONUNBUFFERED": "1",
                  "KOHYA_STUDIO_CACHE": str(args.studio_cache)}
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
