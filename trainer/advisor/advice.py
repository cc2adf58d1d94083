"""What the advisor says, as records: the step arithmetic, the memory at the peak phase by phase,
the time, and the advice with its problems; plus bytes for people (:func:`gib`).

The estimate (:mod:`trainer.advisor.estimate`) fills them and the report
(:mod:`trainer.advisor.report`) words them; neither imports the other for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from trainer.advisor.rules import Recommendation

GIB = 2**30
# Measured here (bench/host_phases.py on the tiny FLUX.1 file, torch 2.13 CPU): a run's process
# holds 0.37 GiB of Python and libraries (torch, diffusers, transformers) while it loads, 0.41
# GiB once it trains (peft, accelerate's training state, the optimizers); a CUDA or ROCm
# context with cuBLAS holds about 0.5 GiB that PyTorch's own count of allocated memory leaves
# out.
RUNTIME = {"cpu": int(0.41 * GIB), "cuda": int(0.5 * GIB), "rocm": int(0.6 * GIB),
           "xpu": int(0.4 * GIB), "mps": int(0.3 * GIB)}
RUNTIME_LOADING = int(0.37 * GIB)  # the host's, before the training libraries are imported
# On the CPU a step's tensors come from malloc, whose heap keeps freed blocks (and oneDNN its
# buffers): measured on SD 1.5's UNet (64-256 px, batch 2-8), the RSS grew by 1.5-1.9 x the
# tensors alive at the step's peak.
CPU_HEAP = 0.5
FITS_BELOW = 0.95  # of the device's memory: the rest goes to fragmentation and other programs


@dataclass(frozen=True)
class Steps:
    images: int = 0
    validation_images: int = 0
    samples_per_epoch: int = 0
    batches_per_epoch: int = 0
    steps_per_epoch: int = 0
    epochs: int = 0
    total_steps: int = 0
    largest_bucket: tuple[int, int] = (512, 512)
    problem: Optional[str] = None


@dataclass(frozen=True)
class Memory:
    phase: str
    lines: tuple[tuple[str, int], ...]  # what -> bytes, summing to the peak
    capacity: Optional[int]
    checkpointing: bool

    @property
    def peak(self) -> int:
        return sum(b for _, b in self.lines)

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak <= self.capacity * FITS_BELOW


@dataclass(frozen=True)
class Phase:
    """One phase of a run: what the machine's RAM holds in it, line by line, and the device's
    peak (None on the CPU, where the RAM is the device)."""

    name: str
    lines: tuple[tuple[str, int], ...]
    device: Optional[int]

    @property
    def host(self) -> int:
        return sum(b for _, b in self.lines)


@dataclass(frozen=True)
class Timing:
    seconds_per_step: float
    total_seconds: Optional[float]
    tflop_per_step: float
    basis: str


@dataclass
class Advice:
    device: str
    precision: str
    steps: Steps
    memory: Optional[Memory] = None
    other: Optional[Memory] = None  # with the other gradient_checkpointing setting
    timing: Optional[Timing] = None
    other_timing: Optional[Timing] = None
    recommendations: list[Recommendation] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)  # RAM and device, phase by phase
    ram: Optional[int] = None  # the machine's RAM

    def host_peak(self) -> Optional[Phase]:
        """The phase that holds the most RAM (None without phases)."""
        return max(self.phases, key=lambda p: p.host, default=None)

    @property
    def fits_ram(self) -> bool:
        peak = self.host_peak()
        return peak is None or not self.ram or peak.host <= self.ram * FITS_BELOW


def gib(n: Optional[float]) -> str:
    """Bytes for people: GiB from 1 GiB up, MiB below."""
    if n is None:
        return "?"
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"
