"""How many CPU threads training computes with, on the CPU backend.

PyTorch's OpenMP threads spin while they wait for work. With every core taken and another
process busy, each parallel region waits for a thread that is not running, and a step becomes
many times slower (on 2 cores, a 2-thread run next to a busy process: 19 s/step, against 1.4
with one thread). Leaving a core free always avoids that, but then an idle machine computes on
half its cores on a 2-core machine (1.4 s/step against 0.89 with both).

So the policy follows the machine: all cores while the other processes together use less than
half a core, one core fewer while they use more (the UI's browser, a second job, a build). It
measures the others from /proc/stat minus this process's own CPU time, at most every few
seconds, at step boundaries. ``OMP_NUM_THREADS`` (or ``torch.set_num_threads`` before the run)
fixes the count instead. The figures behind the default: ``python bench/cpu_threads.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

BUSY = 0.5  # cores used by other processes from which training leaves one core free
CALM = 0.25  # ... and below which it takes all of them again (a gap, so that it does not flap)
INTERVAL_S = 5.0


@dataclass
class CpuTimes:
    """CPU time in clock ticks: the machine's busy and total time, and this process's."""

    busy: int
    total: int
    own: int


def read_cpu_times() -> Optional[CpuTimes]:
    """From /proc (Linux); None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return CpuTimes(busy=total - idle, total=total, own=int(own[11]) + int(own[12]))


def others_cores(before: CpuTimes, after: CpuTimes, cores: int) -> float:
    """Cores that other processes used on average between two readings."""
    total = after.total - before.total
    if total <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / total * cores)


def wanted_threads(others: float, current: int, cores: int) -> int:
    """All cores when the others are calm, one fewer when they are busy, else unchanged."""
    if cores <= 1:
        return 1
    if others >= BUSY:
        return cores - 1
    if others < CALM:
        return cores
    return current


class CpuThreads:
    """The adaptive thread count of one run. ``tick()`` at step boundaries is cheap: it reads
    two small /proc files at most every ``interval`` seconds."""

    def __init__(self, torch_module: Any, cores: int,
                 read: Callable[[], Optional[CpuTimes]] = read_cpu_times,
                 clock: Callable[[], float] = time.monotonic, interval: float = INTERVAL_S):
        self.torch, self.read, self.clock, self.interval = torch_module, read, clock, interval
        self.cores = cores
        self.last = read()
        self.last_at = clock()
        self.changes: list[tuple[int, float]] = []  # (threads, others' cores) at each change

    @property
    def threads(self) -> int:
        return int(self.torch.get_num_threads())

    def tick(self) -> Optional[int]:
        """Re-decide when ``interval`` has passed; the new count when it changed, else None."""
        if self.last is None or self.clock() - self.last_at < self.interval:
            return None
        now = self.read()
        if now is None:
            return None
        others = others_cores(self.last, now, self.cores)
        self.last, self.last_at = now, self.clock()
        current = self.threads
        wanted = wanted_threads(others, current, self.cores)
        if wanted == current:
            return None
        self.torch.set_num_threads(wanted)
        self.changes.append((wanted, others))
        return wanted


def adaptive_threads(backend: str, torch_module: Any = None) -> Optional[CpuThreads]:
    """The policy for a CPU run, or None: another backend, OMP_NUM_THREADS set, or no /proc."""
    if backend != "cpu" or os.environ.get("OMP_NUM_THREADS"):
        return None
    if torch_module is None:
        import torch as torch_module
    global _ALL_CORES
    if _ALL_CORES is None:  # torch's own choice (physical cores), before anything changed it
        _ALL_CORES = int(torch_module.get_num_threads())
    policy = CpuThreads(torch_module, _ALL_CORES)
    if policy.last is None:
        return None
    if policy.threads != _ALL_CORES:  # e.g. lowered by the previous run in this process
        torch_module.set_num_threads(_ALL_CORES)
    return policy


_ALL_CORES: Optional[int] = None
