"""How the benches of the studio against diffusers' examples (bench/zimage_lora_vs_diffusers.py,
bench/flux2_klein_lora_vs_diffusers.py) run and measure one training process: its output
timestamped as it arrives (each carriage-return or newline segment, so every progress-bar
refresh), the RSS and the CPU seconds of its process tree polled, its own peak RSS from
``wait4``; and the machine facts the table notes (the CPU kind, the load before a run)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil


def _read_segments(stream, t0: float, segments: list, log) -> None:
    """Splits the stream on \\n and \\r; stamps each segment with its first byte's arrival."""
    buf, stamp = b"", 0.0
    while chunk := os.read(stream.fileno(), 65536):
        now = time.monotonic() - t0
        log.write(chunk)
        for piece in re.split(rb"([\r\n])", chunk):
            if piece in (b"\r", b"\n"):
                if buf.strip():
                    segments.append((stamp, buf.decode("utf-8", "replace").strip()))
                buf = b""
            elif piece:
                if not buf:
                    stamp = now
                buf += piece
    if buf.strip():
        segments.append((stamp, buf.decode("utf-8", "replace").strip()))


def _tree_usage(pid: int) -> tuple[int, float]:
    """The RSS (bytes) and the CPU seconds (user + system, all threads) of ``pid`` and its
    descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0.0
    rss, cpu = 0, 0.0
    for proc in procs:
        try:
            rss += proc.memory_info().rss
            times = proc.cpu_times()
            cpu += times.user + times.system
        except psutil.Error:
            pass
    return rss, cpu


def _poll(pid: int, t0: float, stop: threading.Event, peak: list, cpu: list) -> None:
    while not stop.is_set():
        rss, seconds = _tree_usage(pid)
        peak[0] = max(peak[0], rss)
        if seconds:
            cpu.append((time.monotonic() - t0, seconds))
        stop.wait(0.1)


def cpu_at(samples: list[tuple[float, float]], t: float) -> float | None:
    """The tree's CPU seconds at ``t`` seconds from launch (the last sample before it)."""
    before = [seconds for when, seconds in samples if when <= t]
    return before[-1] if before else None


def run_measured(cmd: list[str], cwd: str, env: dict, log_path: Path, timeout: float) -> dict:
    """Runs ``cmd`` in its own session; {rc, wall_s, segments [(s, text)], tree_peak bytes,
    maxrss bytes, cpu [(s, the tree's CPU seconds) every 0.1 s]}. Killed (its whole group) past
    ``timeout`` seconds. The output goes to ``log_path``, its segments with their seconds from
    launch to ``log_path``'s ``.ts``."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    segments: list = []
    peak, cpu, stop = [0], [], threading.Event()
    with open(log_path, "wb", buffering=0) as log:
        reader = threading.Thread(target=_read_segments, args=(proc.stdout, t0, segments, log))
        poller = threading.Thread(target=_poll, args=(proc.pid, t0, stop, peak, cpu))
        reader.start()
        poller.start()
        timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            stop.set()
            poller.join()
        wall = time.monotonic() - t0
        reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    log_path.with_suffix(".ts").write_text("".join(f"{t:.2f}\t{text}\n" for t, text in segments))
    return {"rc": proc.returncode, "wall_s": wall, "segments": segments,
            "tree_peak": peak[0], "maxrss": usage.ru_maxrss * 1024, "cpu": cpu}


def wait_for_load(max_load: float, timeout: float) -> float:
    """Waits until the 1-minute load average is under ``max_load`` or ``timeout`` seconds
    passed; the load average at the start (the run's note)."""
    start = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - start < timeout:
        time.sleep(5)
    return round(os.getloadavg()[0], 2)


def cpu_kind() -> str:
    """The CPU's name, cores and whether it has bf16 units (AVX512-BF16 or AMX) or AVX2 only."""
    flags, name = set(), "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    if flags & {"amx_bf16", "avx512_bf16"}:
        units = "bf16 units (" + ", ".join(sorted(flags & {"amx_bf16", "avx512_bf16"})) + ")"
    elif "avx512f" in flags:
        units = "AVX-512, no bf16 units"
    else:
        units = "AVX2 only, no bf16 units" if "avx2" in flags else "no AVX2"
    return f"{name}, {os.cpu_count()} cores, {units}"
