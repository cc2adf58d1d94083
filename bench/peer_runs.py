"""How bench/compare_peers.py runs each configuration: it waits for a quiet machine, runs one
command under the peers' README's run_one.sh in its own process group, and loads their
parse_run.py."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


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
