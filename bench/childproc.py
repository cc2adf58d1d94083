"""What the bench scripts share: run a case in a fresh Python process (so that its peak RSS is
its own) and time the training steps of a run."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_or_run_child(parser: argparse.ArgumentParser, case: Callable[..., dict]):
    """The script's arguments; or, when it was started as a child (``--child JSON``), run
    ``case(*JSON)`` here, print its result as the last stdout line and exit."""
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(case(*json.loads(args.child))))
        raise SystemExit(0)
    return args


def run_child(script: str, args: list, **env: str) -> dict:
    """``python SCRIPT --child JSON(args)``; the JSON object on its last stdout line."""
    cmd = [sys.executable, script, "--child", json.dumps(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


class StepTimes:
    """An event sink that notes when each training step ends."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def emit(self, event) -> None:
        from trainer.events import Step

        if isinstance(event, Step):
            self.times.append(time.perf_counter())

    def rate(self, warmup: int = 0) -> float:
        """Steps per second after the first ``warmup`` steps."""
        timed = self.times[warmup:]
        return (len(timed) - 1) / (timed[-1] - timed[0]) if len(timed) > 1 else float("nan")


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
