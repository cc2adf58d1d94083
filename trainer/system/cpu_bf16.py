"""bf16 on the CPU: which bf16 units this CPU has, and what bf16 base weights measured here.

Many CPUs (Intel Sapphire Rapids and later with AMX, AMD Zen 4 and later with AVX512-BF16, Arm
cores with the BF16 extension) multiply bf16 matrices several times faster than fp32. Whether a
training step gains from it depends on the model and the resolution: at 64 px an SD 1.5 UNet is
slower with bf16 weights, at 256 px twice as fast. So ``mixed_precision = "auto"``
on the CPU measures it once per CPU, torch, model and resolution (trainer/run/cpu_precision.py)
and keeps the result here, in a small JSON file that the doctor reports and later runs reuse.

Nothing here asks torch about an accelerator; the CPU's flags come from ``/proc/cpuinfo``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

# x86 flags (lscpu / /proc/cpuinfo "flags") and the aarch64 feature ("Features: ... bf16")
X86_UNITS = ("amx_bf16", "avx512_bf16")
ARM_UNIT = "bf16"
CACHE_ENV = "KOHYA_STUDIO_CACHE"
# The bf16 units to assume instead of reading /proc/cpuinfo: "none" (auto then stays fp32
# without a probe: runs that must not depend on a timing, such as the tests), or a
# comma-separated list such as "amx_bf16,avx512_bf16"
UNITS_ENV = "KOHYA_STUDIO_CPU_BF16_UNITS"
CACHE_FILE = "cpu_bf16.json"
# bf16 is chosen only when it is clearly faster: a ratio near 1 is within timing noise
FASTER_BELOW = 0.9


def bf16_units(cpuinfo: Optional[str] = None) -> tuple[str, ...]:
    """The bf16 matrix units the CPU reports, e.g. ``("amx_bf16", "avx512_bf16")``; empty when
    it has none (bf16 then runs through slow conversions)."""
    if cpuinfo is None and os.environ.get(UNITS_ENV) is not None:
        named = os.environ[UNITS_ENV].replace(",", " ").split()
        return tuple(unit for unit in named if unit.lower() != "none")
    text = cpuinfo if cpuinfo is not None else _read_cpuinfo()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    found = tuple(unit for unit in X86_UNITS if unit in flags)
    if not found and ARM_UNIT in flags:
        found = (ARM_UNIT,)
    return found


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cache_file() -> Path:
    """``$KOHYA_STUDIO_CACHE/cpu_bf16.json``, else in ``$KOHYA_STUDIO_HOME/cache`` (a private
    home, as the tests use), else ``~/.cache/kohya-studio/``."""
    root, home = os.environ.get(CACHE_ENV), os.environ.get("KOHYA_STUDIO_HOME")
    if root:
        return Path(root).expanduser() / CACHE_FILE
    if home:
        return Path(home).expanduser() / "cache" / CACHE_FILE
    return Path.home() / ".cache" / "kohya-studio" / CACHE_FILE


def probe_key(cpu: str, torch_version: str, model: str, resolution: int | str, threads: int) -> str:
    """What a measurement depends on: the CPU, torch (its kernels), the model's shape, the
    resolution and the thread count."""
    return f"{cpu} | torch {torch_version} | {model} | {resolution}px | {threads} thread(s)"


def cached_results() -> dict[str, dict[str, Any]]:
    """Every stored measurement, ``{key: {"fp32_s", "bf16_s", "ratio", "when"}}``; an unreadable
    file counts as empty (it is only a cache)."""
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_ratio(key: str) -> Optional[float]:
    entry = cached_results().get(key)
    ratio = entry.get("ratio") if isinstance(entry, dict) else None
    return float(ratio) if isinstance(ratio, (int, float)) and ratio > 0 else None


def store_result(key: str, fp32_s: float, bf16_s: float) -> float:
    """Keep a measurement (best effort: a read-only home only costs the next run a probe);
    returns the ratio bf16 / fp32."""
    ratio = bf16_s / fp32_s
    data = cached_results()
    data[key] = {"fp32_s": round(fp32_s, 5), "bf16_s": round(bf16_s, 5),
                 "ratio": round(ratio, 4), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
    return ratio


def seconds(fn: Callable[[], Any], repeats: int = 1) -> float:
    """The best of ``repeats`` timed calls after one untimed call (which builds the kernels)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def seconds_alternated(first: Callable[[], Any], second: Callable[[], Any],
                       rounds: int = 2) -> tuple[float, float]:
    """The best of ``rounds`` timed calls of each, taken in turns (first, second, first, ...)
    after one untimed call of each: a disturbance (another process, a frequency change) that
    lasts a few seconds then slows both sides alike rather than one."""
    first()
    second()
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((first, second)):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0], best[1]


def matmul_seconds(size: int = 1024, torch_module: Any = None) -> tuple[float, float]:
    """One ``size`` x ``size`` matmul in fp32 and in bf16 on the CPU: the doctor's quick look
    at the units (a model's step gains less: not all of it is matmuls)."""
    torch = torch_module
    if torch is None:
        import torch
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    b16 = a.to(torch.bfloat16)
    return seconds(lambda: a @ a, 3), seconds(lambda: b16 @ b16, 3)


def ratio_words(ratio: float) -> str:
    """``0.5`` -> ``bf16 2.00x faster``; ``1.25`` -> ``bf16 1.25x slower``."""
    if ratio <= 1:
        return f"bf16 {1 / ratio:.2f}x faster"
    return f"bf16 {ratio:.2f}x slower"
