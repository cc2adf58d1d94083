"""A new user's first run: how long the README's commands take on a fresh clone.

    python bench/first_run.py [--rev HEAD] [--only gui|tests] [--keep]

Clones this repository (at --rev) into a temporary folder, twice, and times in each:

- gui:   `./gui.sh` from the clone until http://127.0.0.1:<port>/ answers 200 (set-up of .venv
         through ./setup.sh, then the app's start), then stops it;
- tests: what `./test.sh` does before its first test: `./setup.sh --dev` and pytest's collection
         of the whole suite (`pytest --collect-only`). Running the suite itself is not timed
         (it is minutes of CPU and its length has nothing to do with the set-up), nor Debian's
         chromium, which test.sh installs once per machine.

Each clone gets its own .venv (the caches of pip and uv under ~/.cache are what is "warm": run
the bench twice and report the second run). Prints the figures, the size of the venv and the
machine's load average, which matters on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clone(rev: str, into: Path) -> Path:
    dest = into / "kohya-studio"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", rev], check=True)
    return dest


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KOHYA_", "VIRTUAL_ENV", "UV_"))}
    env["HF_HUB_OFFLINE"] = "1"
    env["GRADIO_ANALYTICS_ENABLED"] = "False"
    return env


def page_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def time_gui(checkout: Path, log: Path) -> float:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(["./gui.sh", "--port", str(port)], cwd=checkout, env=clean_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not page_answers(url):
            if proc.poll() is not None:
                raise SystemExit(f"gui.sh exited with {proc.returncode}; see {log}")
            if time.perf_counter() - start > PAGE_TIMEOUT_S:
                raise SystemExit(f"no page after {PAGE_TIMEOUT_S} s; see {log}")
            time.sleep(0.25)
        return time.perf_counter() - start
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def time_tests_setup(checkout: Path, log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as out:
        for cmd in (["./setup.sh", "--dev"],
                    [".venv/bin/python", "-m", "pytest", "--collect-only", "-q", "-p",
                     "no:cacheprovider"]):
            subprocess.run(cmd, cwd=checkout, env=clean_env(), stdout=out,
                           stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def venv_size_mb(checkout: Path) -> float:
    out = subprocess.run(["du", "-sm", str(checkout / ".venv")], capture_output=True, text=True)
    return float(out.stdout.split()[0]) if out.returncode == 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the commit to clone (default HEAD)")
    parser.add_argument("--only", choices=["gui", "tests"], help="time one command only")
    parser.add_argument("--keep", action="store_true", help="keep the clones and their logs")
    args = parser.parse_args()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev],
                         capture_output=True, text=True, check=True).stdout.strip()
    print(f"first run of {rev}; load average before: {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} cores)", flush=True)
    rows = []
    for name, timer in (("gui", time_gui), ("tests", time_tests_setup)):
        if args.only and args.only != name:
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"first-run-{name}-"))
        checkout = clone(rev, tmp)
        seconds = timer(checkout, tmp / f"{name}.log")
        rows.append((name, seconds, venv_size_mb(checkout), os.getloadavg()[0]))
        print(f"{name}: {seconds:.1f} s", flush=True)
        if args.keep:
            print(f"  kept {checkout} (log: {tmp / f'{name}.log'})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'command':<42}{'seconds':>9}{'venv MB':>9}{'load after':>12}")
    labels = {"gui": "./gui.sh until the page is served",
              "tests": "./setup.sh --dev + pytest --collect-only"}
    for name, seconds, size, load in rows:
        print(f"{labels[name]:<42}{seconds:>9.1f}{size:>9.0f}{load:>12.2f}")


if __name__ == "__main__":
    sys.exit(main())
