"""What the machine has, asked without torch: ROCm and its GPU agents (rocminfo), NVIDIA GPUs
(nvidia-smi), an Intel GPU runtime (sycl-ls, xpu-smi, Level Zero, or a PCI device of Intel's),
and the environment variables that steer them.

Every look goes through :class:`Probes`, so tests can simulate each machine; the doctor
(:mod:`trainer.tools.doctor`) puts these facts beside what torch reports.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

ROCMINFO = "/opt/rocm/bin/rocminfo"
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
INTEL_VENDOR = "0x8086"


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _run_command(cmd: Sequence[str]) -> Optional[str]:
    """stdout of a command that succeeded within 15 s, else None."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class Probes:
    """How the doctor looks at the system; the defaults read the real one."""

    which: Callable[[str], Optional[str]] = shutil.which
    exists: Callable[[str], bool] = os.path.exists
    glob: Callable[[str], list[str]] = glob.glob
    read_text: Callable[[str], Optional[str]] = _read_text
    run: Callable[[Sequence[str]], Optional[str]] = _run_command
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class SystemFacts:
    """What the system has, independent of torch."""

    rocm_installed: bool = False
    rocm_version: Optional[str] = None
    amd_gfx: tuple[str, ...] = ()  # GPU agents that rocminfo lists, e.g. ("gfx1100",)
    nvidia_gpus: tuple[str, ...] = ()  # names that nvidia-smi -L lists
    intel_gpu: Optional[str] = None  # how an Intel GPU runtime was found, None when not
    hsa_override: Optional[str] = None
    cuda_visible_devices: Optional[str] = None


def gather_facts(probes: Probes) -> SystemFacts:
    """Ask the system (through ``probes``) about ROCm, NVIDIA and Intel GPUs."""
    rocminfo = probes.which("rocminfo") or (ROCMINFO if probes.exists(ROCMINFO) else None)
    amd_gfx: tuple[str, ...] = ()
    if rocminfo:
        out = probes.run([rocminfo]) or ""
        amd_gfx = tuple(dict.fromkeys(re.findall(r"Name:\s+(gfx[0-9a-f]+)\b", out)))
    nvidia: tuple[str, ...] = ()
    if probes.which("nvidia-smi"):
        out = probes.run(["nvidia-smi", "-L"]) or ""
        nvidia = tuple(re.findall(r"^GPU \d+: (.+?)(?: \(UUID: [^)]*\))?\s*$", out, re.M))
    version = probes.read_text(ROCM_VERSION_FILE)
    return SystemFacts(
        rocm_installed=bool(rocminfo), rocm_version=version.strip() if version else None,
        amd_gfx=amd_gfx, nvidia_gpus=nvidia, intel_gpu=_find_intel_gpu(probes),
        hsa_override=probes.env.get("HSA_OVERRIDE_GFX_VERSION"),
        cuda_visible_devices=probes.env.get("CUDA_VISIBLE_DEVICES"),
    )


def _find_intel_gpu(probes: Probes) -> Optional[str]:
    """sycl-ls listing a Level Zero GPU, xpu-smi on PATH, or a render node of vendor 0x8086."""
    if probes.which("sycl-ls"):
        out = probes.run(["sycl-ls"]) or ""
        if re.search(r"level_zero:gpu", out):
            return "sycl-ls lists a Level Zero GPU"
    if probes.which("xpu-smi"):
        return "xpu-smi is installed"
    for node in sorted(probes.glob("/dev/dri/renderD*")):
        name = os.path.basename(node)
        vendor = probes.read_text(f"/sys/class/drm/{name}/device/vendor")
        if vendor and vendor.strip().lower() == INTEL_VENDOR:
            return f"{node} is an Intel GPU (vendor {INTEL_VENDOR})"
    return None
