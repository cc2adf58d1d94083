"""Which accelerator this process trains on, and which precision it can use.

This is the ONLY module of the project that probes ``torch.cuda``, ``torch.version.hip``,
``torch.xpu`` and ``torch.backends.mps``. Everything else asks :func:`detect` once and passes
the :class:`DeviceInfo` down (``run()`` does it at the start of a run; the GUI banner and the
doctor do it too).

Every function takes an optional ``torch_module`` so that tests can hand in a fake torch
(a ``SimpleNamespace`` with the attributes used here) and simulate each backend without a GPU.

Precision rules (what ``training.mixed_precision = "auto"`` becomes) are in
:func:`resolve_precision`; they follow what accelerate actually does with each setting, so that a
setting is refused here instead of being silently ignored there.
"""

from __future__ import annotations

import gc
import os
import platform
import re
from dataclasses import dataclass
from typing import Any, Optional

BACKENDS = ("cuda", "rocm", "xpu", "mps", "cpu")
PRECISIONS = ("auto", "no", "fp16", "bf16")
LABELS = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU", "mps": "MPS", "cpu": "CPU"}

# accelerate refuses fp16 on MPS before torch 2.5 and bf16 on MPS before torch 2.6
# (accelerate.Accelerator.__init__); Metal has bfloat16 from macOS 14 on.
MPS_FP16_TORCH = (2, 5)
MPS_BF16_TORCH = (2, 6)
MPS_BF16_MACOS = (14, 0)


class PrecisionError(ValueError):
    """A mixed-precision setting that the device cannot honour; the message says what to pick."""


@dataclass(frozen=True)
class DeviceInfo:
    """What :func:`detect` found: the backend, the device and what it can compute in."""

    backend: str  # one of BACKENDS
    name: str
    torch_device: str  # "cuda:0" (CUDA and ROCm), "xpu:0", "mps" or "cpu"
    memory_bytes: Optional[int]  # total device memory; system RAM for the CPU
    bf16_ok: bool
    fp16_ok: bool
    torch_version: str
    cuda_version: Optional[str] = None
    hip_version: Optional[str] = None
    xpu_version: Optional[str] = None

    @property
    def label(self) -> str:
        """The backend as people write it: CUDA, ROCm, XPU, MPS, CPU."""
        return LABELS.get(self.backend, self.backend)

    @property
    def is_gpu(self) -> bool:
        return self.backend != "cpu"

    def summary(self) -> str:
        """One line for a banner, e.g. ``CUDA · NVIDIA H200 · 139.8 GiB · bf16``.

        The last part is what ``mixed_precision = "auto"`` resolves to (``fp32`` for "no").
        """
        parts = [self.label, self.name]
        if self.memory_bytes:
            parts.append(format_bytes(self.memory_bytes))
        auto = resolve_precision("auto", self)
        parts.append("fp32" if auto == "no" else auto)
        return " · ".join(parts)


def format_bytes(n: int) -> str:
    """``150_000_000_000`` -> ``139.7 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.1f} {unit}"


def detect(torch_module: Any = None) -> DeviceInfo:
    """Probe torch once and describe the device that training will use.

    Order: CUDA or ROCm (``torch.version.hip`` set and ``torch.cuda.is_available()``), then
    Intel XPU, then Apple MPS, else the CPU.
    """
    torch = _torch(torch_module)
    version = getattr(torch, "version", None)
    versions = {
        "torch_version": str(getattr(torch, "__version__", "unknown")),
        "cuda_version": _opt_str(getattr(version, "cuda", None)),
        "hip_version": _opt_str(getattr(version, "hip", None)),
        "xpu_version": _opt_str(getattr(version, "xpu", None)),
    }
    if _available(getattr(torch, "cuda", None)):
        return _detect_cuda(torch, versions)
    if _available(getattr(torch, "xpu", None)):
        return _detect_xpu(torch, versions)
    if _available(getattr(getattr(torch, "backends", None), "mps", None)):
        return _detect_mps(torch, versions)
    return DeviceInfo(
        backend="cpu", name=cpu_name(), torch_device="cpu", memory_bytes=system_memory(),
        bf16_ok=True, fp16_ok=False, **versions,
    )


def _detect_cuda(torch: Any, versions: dict) -> DeviceInfo:
    """NVIDIA CUDA, or AMD ROCm (a HIP build of torch drives AMD GPUs through ``torch.cuda``)."""
    cuda = torch.cuda
    rocm = bool(versions["hip_version"])
    name = _call(cuda.get_device_name, 0) or ("AMD GPU" if rocm else "NVIDIA GPU")
    props = _call(cuda.get_device_properties, 0)
    return DeviceInfo(
        backend="rocm" if rocm else "cuda", name=name, torch_device="cuda:0",
        memory_bytes=_opt_int(getattr(props, "total_memory", None)),
        bf16_ok=_cuda_bf16(cuda), fp16_ok=True, **versions,
    )


def _cuda_bf16(cuda: Any) -> bool:
    """Native bf16 only: pre-Ampere NVIDIA GPUs emulate it, slower than fp16. ROCm: torch's word."""
    try:
        return bool(cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no including_emulation
        return bool(_call(cuda.is_bf16_supported))
    except Exception:
        return False


def _detect_xpu(torch: Any, versions: dict) -> DeviceInfo:
    """Intel GPUs (Arc, Data Center GPU Max, recent iGPUs) through ``torch.xpu``."""
    xpu = torch.xpu
    props = _call(xpu.get_device_properties, 0)
    check = getattr(xpu, "is_bf16_supported", None)
    bf16 = bool(_call(check)) if check is not None else True
    return DeviceInfo(
        backend="xpu", name=_call(xpu.get_device_name, 0) or "Intel GPU", torch_device="xpu:0",
        memory_bytes=_opt_int(getattr(props, "total_memory", None)),
        bf16_ok=bf16, fp16_ok=True, **versions,
    )


def _detect_mps(torch: Any, versions: dict) -> DeviceInfo:
    """Apple silicon through Metal; the memory is the unified memory Metal recommends using.

    fp16 needs torch >= 2.5 and bf16 torch >= 2.6 (accelerate refuses them before) and bf16 also
    macOS 14 or newer.
    """
    mps = torch.backends.mps
    torch_at = _version_tuple(versions["torch_version"])
    macos_check = getattr(mps, "is_macos_or_newer", None)
    macos_ok = bool(_call(macos_check, *MPS_BF16_MACOS)) if macos_check is not None else False
    name = _call(getattr(mps, "get_name", None)) or "Apple GPU"
    memory = _call(getattr(getattr(torch, "mps", None), "recommended_max_memory", None))
    return DeviceInfo(
        backend="mps", name=str(name), torch_device="mps",
        memory_bytes=_opt_int(memory) or system_memory(),
        bf16_ok=torch_at >= MPS_BF16_TORCH and macos_ok, fp16_ok=torch_at >= MPS_FP16_TORCH,
        **versions,
    )


def resolve_precision(requested: str, info: DeviceInfo) -> str:
    """Turn ``training.mixed_precision`` into what accelerate gets: ``no``, ``fp16`` or ``bf16``.

    ``auto``: bf16 on CUDA, ROCm and XPU when the GPU does bf16 natively, else fp16 on those GPUs;
    ``no`` on the CPU and on MPS (measured: bf16 autocast on a CPU runs at 0.55-0.85x the speed of
    fp32 on a tiny model). An explicit setting that the device cannot do raises
    :class:`PrecisionError` naming what to use instead.
    """
    if requested not in PRECISIONS:
        raise PrecisionError(
            f"mixed_precision = {requested!r} is not one of {', '.join(map(repr, PRECISIONS))}"
        )
    if requested == "auto":
        if info.backend in ("cuda", "rocm", "xpu"):
            if info.bf16_ok:
                return "bf16"
            return "fp16" if info.fp16_ok else "no"
        return "no"
    if requested == "no" or (requested == "bf16" and info.bf16_ok):
        return requested
    if requested == "fp16" and info.fp16_ok:
        return requested
    raise PrecisionError(_refusal(requested, info))


def supported_precisions(info: DeviceInfo) -> list[str]:
    """The explicit settings that :func:`resolve_precision` accepts on this device."""
    return ["no"] + (["fp16"] if info.fp16_ok else []) + (["bf16"] if info.bf16_ok else [])


def _refusal(requested: str, info: DeviceInfo) -> str:
    where = "the CPU" if info.backend == "cpu" else f"{info.name} ({info.label})"
    why = ""
    if info.backend == "cpu" and requested == "fp16":
        why = " (accelerate would silently run fp32)"
    elif info.backend == "mps":
        why = (f" with torch {info.torch_version} (fp16 needs torch >= 2.5, bf16 torch >= 2.6 "
               "and macOS 14)")
    elif requested == "bf16" and info.backend == "cuda":
        why = " (no native bf16; NVIDIA needs compute capability 8.0, Ampere, or newer)"
    options = [p for p in supported_precisions(info) if p != requested]
    return (f"mixed_precision = {requested!r} is not supported on {where}{why}; use "
            + " or ".join(map(repr, options)))


def check_full_bf16(full_bf16: bool, precision: str) -> None:
    """``training.full_bf16`` keeps the weights in bf16, so the resolved precision must be bf16.

    ``precision`` is the result of :func:`resolve_precision` (``no``, ``fp16`` or ``bf16``).
    """
    if precision not in ("no", "fp16", "bf16"):
        raise ValueError(f"resolve the precision first (got {precision!r})")
    if full_bf16 and precision != "bf16":
        raise PrecisionError(
            f"full_bf16 = true needs mixed_precision = 'bf16', but the precision is "
            f"{precision!r}; set training.mixed_precision = 'bf16' (on a device that does bf16) "
            "or full_bf16 = false"
        )


def empty_cache(info: DeviceInfo, torch_module: Any = None) -> None:
    """Drop unreferenced Python objects, then return the backend's cached memory to the system."""
    gc.collect()
    torch = _torch(torch_module)
    if info.backend in ("cuda", "rocm"):
        torch.cuda.empty_cache()
    elif info.backend == "xpu":
        torch.xpu.empty_cache()
    elif info.backend == "mps":
        torch.mps.empty_cache()


def _backend_module(info: DeviceInfo, torch: Any) -> Any:
    return {"cuda": torch.cuda, "rocm": torch.cuda, "xpu": getattr(torch, "xpu", None),
            "mps": getattr(torch, "mps", None)}.get(info.backend)


def device_rng_state(info: DeviceInfo, torch_module: Any = None) -> Any:
    """The device's random generator state (None on the CPU), for an exact resume."""
    torch = _torch(torch_module)
    module = _backend_module(info, torch)
    if module is None:
        return None
    if info.backend == "mps":
        return module.get_rng_state()
    return module.get_rng_state_all()


def set_device_rng_state(info: DeviceInfo, state: Any, torch_module: Any = None) -> None:
    torch = _torch(torch_module)
    module = _backend_module(info, torch)
    if module is None or state is None:
        return
    if info.backend == "mps":
        module.set_rng_state(state)
    else:
        module.set_rng_state_all(state)


def memory_in_use(info: DeviceInfo, torch_module: Any = None) -> Optional[int]:
    """The most memory the run held on the device (bytes), where the backend can tell."""
    torch = _torch(torch_module)
    module = _backend_module(info, torch)
    try:
        return int(module.max_memory_allocated()) if module is not None else None
    except Exception:  # noqa: BLE001 - a backend without the counter
        return None


def memory_free(info: DeviceInfo, torch_module: Any = None) -> Optional[int]:
    """Memory free for new tensors (bytes): the device's free memory on a GPU whose backend
    tells (``mem_get_info``), else the system's available RAM (Linux ``MemAvailable``); None
    where neither is known."""
    if info.is_gpu:
        module = _backend_module(info, _torch(torch_module))
        try:
            return int(module.mem_get_info()[0])
        except Exception:  # noqa: BLE001 - a backend without the counter (MPS, an old XPU)
            return None
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def system_memory() -> Optional[int]:
    """Total RAM in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _torch(torch_module: Any) -> Any:
    if torch_module is not None:
        return torch_module
    import torch

    return torch


def _available(namespace: Any) -> bool:
    check = getattr(namespace, "is_available", None)
    return bool(_call(check)) if check is not None else False


def _call(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None when fn is missing or raises (a broken driver must not crash us)."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


def _opt_str(value: Any) -> Optional[str]:
    return str(value) if value else None


def _opt_int(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def _version_tuple(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# --- CUDA streams, for copies that overlap compute (block swap) ------------------------------

def side_stream(device: Any) -> Any:
    """A new CUDA (or ROCm) stream on ``device``, for host-to-device copies beside compute."""
    import torch

    return torch.cuda.Stream(device)


def on_stream(stream: Any) -> Any:
    """A context in which CUDA work goes to ``stream``."""
    import torch

    return torch.cuda.stream(stream)


def recorded_event(stream: Any) -> Any:
    """An event recorded on ``stream`` now: done when its queued work is done."""
    import torch

    event = torch.cuda.Event()
    event.record(stream)
    return event


def current_stream(device: Any) -> Any:
    import torch

    return torch.cuda.current_stream(device)
