"""bench/compare_peers.py's reading of its runs and its report: each run's log and timings
(s/step, peak RSS, step 1, the studio's start-up stages and choices), the medians per
configuration, the studio / peer ratios, issue 20's goals and the printed tables."""

from __future__ import annotations

import os
import re
import statistics
import sys
from pathlib import Path

STEP_FROM = 10  # the first steps (compilation, allocator warm-up) are not timed


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
