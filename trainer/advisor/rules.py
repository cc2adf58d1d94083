"""The advisor's knowledge of devices and its rules: what to set on this device, for this config.

The device rules start from kohya_ss's tuning guidance for AMD GPUs, which holds for the others
too: under 16 GB, gradient checkpointing and fp16/bf16 mixed precision; an RDNA3 Radeon: bf16;
an Instinct MI300-class or a Hopper GPU: bf16; the CPU: fp32, or bf16 base weights where it has
bf16 units and they measure faster (``auto``), and a thread count that leaves the machine
usable. fp8 base weights are one of the memory changes on any GPU. When the estimate does
not fit, the changes are tried one at a time on the estimate, least intrusive first, and the
first that fits is what to change first; when none fits alone they are combined in that order.

A rule returns :class:`Recommendation` objects whose ``changes`` are dotted settings and values
(one click away in the GUI, ``--set`` on the command line); advice without changes is for
things no setting covers.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

GB = 10**9
SMALL_MEMORY = 16 * GB
# Dense fp16/bf16 tensor throughput, fp32 throughput (TFLOP/s, vendors' datasheets), by the
# device name's words; the first match wins, so longer names come first.
THROUGHPUT: tuple[tuple[str, float, float], ...] = (
    ("gh200", 989, 67), ("h200", 989, 67), ("h100", 989, 67), ("h800", 989, 67),
    ("a100", 312, 19.5), ("l40s", 362, 91.6), ("l40", 181, 90.5), ("a10g", 70, 31),
    ("a10", 125, 31.2), ("l4", 121, 30.3), ("v100", 125, 15.7), ("t4", 65, 8.1),
    ("rtx 4090", 165, 82.6), ("rtx 4080", 97.5, 48.7), ("rtx 4070", 58, 29),
    ("rtx 4060", 30, 15), ("rtx 3090", 71, 35.6), ("rtx 3080", 59.5, 29.8),
    ("rtx 3070", 40.6, 20.3), ("rtx 3060", 25.4, 12.7), ("rtx 20", 40, 10),
    ("mi300x", 1307, 163), ("mi300a", 981, 122), ("mi325", 1307, 163), ("mi250", 362, 45),
    ("mi210", 181, 22.6), ("7900 xtx", 123, 61), ("7900", 103, 52), ("7800", 74, 37),
    ("7700", 70, 35), ("7600", 43, 21.5), ("arc a770", 138, 19.7), ("max 1550", 419, 52),
)
DEFAULT_GPU = (50.0, 15.0)
# Of the peak, for a UNet's mix of convolutions and attention; a CPU's "peak" is measured on a
# 1024 x 1024 matmul, which the UNet's oneDNN convolutions match (measured on SD 1.5's shapes).
EFFICIENCY = {"gpu": 0.35, "cpu": 1.0}
_CPU_RATE: dict[str, float] = {}


@dataclass(frozen=True)
class Recommendation:
    title: str
    why: str
    changes: dict[str, Any] = field(default_factory=dict)  # dotted setting -> value
    saves: Optional[int] = None  # bytes of peak memory it saves, where that is the point
    done: bool = False  # already so: shown as a check, nothing to apply


def is_rdna3(info: Any) -> bool:
    name = info.name.lower()
    return info.backend == "rocm" and bool(
        re.search(r"\brx 7\d{3}|\bw7\d{3}|gfx11", name))


def is_big_accelerator(info: Any) -> bool:
    """Instinct MI300-class or NVIDIA Hopper: bf16 and fp8 tensor cores, lots of memory."""
    name = info.name.lower()
    return bool(re.search(r"mi3\d\d|\bgh?200\b|\bh1\d\d\b|\bh200\b|\bh800\b|\bh20\b", name))


def cpu_tflops(threads: int) -> float:
    """This CPU's fp32 matmul rate (TFLOP/s) for ``threads`` training threads: measured once
    with torch's current threads (changing them would slow a run in progress) and scaled."""
    import torch

    if "rate" not in _CPU_RATE:
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        torch.mm(a, b)
        start, reps = time.perf_counter(), 8
        for _ in range(reps):
            torch.mm(a, b)
        elapsed = max(time.perf_counter() - start, 1e-6)
        _CPU_RATE["rate"] = 2 * 1024**3 * reps / elapsed / 1e12 / torch.get_num_threads()
    return _CPU_RATE["rate"] * threads


def cpu_bf16_ratio() -> float:
    """bf16 over fp32 seconds of one matmul on this CPU (the doctor's probe,
    trainer/system/cpu_bf16.py), measured once."""
    from trainer.system.cpu_bf16 import matmul_seconds

    if "bf16" not in _CPU_RATE:
        fp32_s, bf16_s = matmul_seconds(1024)
        _CPU_RATE["bf16"] = max(bf16_s, 1e-9) / max(fp32_s, 1e-9)
    return _CPU_RATE["bf16"]


def throughput(info: Any, precision: str) -> tuple[float, str]:
    """(effective TFLOP/s for training, where the number comes from)."""
    if info.backend == "cpu":
        threads = cpu_threads(info)[0]
        rate = cpu_tflops(threads)
        if precision != "bf16":
            return rate * EFFICIENCY["cpu"], (f"measured fp32 matmul {rate * 1000:.0f} "
                                              f"GFLOP/s on {threads} thread(s)")
        from trainer.system.cpu_bf16 import ratio_words

        ratio = cpu_bf16_ratio()  # bf16 / fp32 seconds: 20x on a CPU without bf16 units
        return rate / ratio * EFFICIENCY["cpu"], (
            f"measured fp32 matmul {rate * 1000:.0f} GFLOP/s on {threads} thread(s), bf16 "
            f"{rate / ratio * 1000:.0f} ({ratio_words(ratio)}, the doctor's probe)")
    name = info.name.lower()
    half, single = next(((h, s) for key, h, s in THROUGHPUT if key in name), DEFAULT_GPU)
    peak = single if precision == "no" else half
    known = any(key in name for key, _, _ in THROUGHPUT)
    basis = f"{peak:g} TFLOP/s peak" + ("" if known else " (an unknown GPU: a rough guess)")
    return peak * EFFICIENCY["gpu"], basis


def cpu_threads(info: Any) -> tuple[int, int]:
    """(threads training uses, cores): trainer.system.threads takes every core while the machine is
    otherwise idle, unless OMP_NUM_THREADS says otherwise."""
    cores = os.cpu_count() or 1
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"]), cores
    return cores, cores


def _half(info: Any) -> str:
    return "bf16" if info.bf16_ok else "fp16"


def _cpu_precision(cfg: Any, precision: str) -> list[Recommendation]:
    """bf16 on the CPU pays only with bf16 units, and then by model and resolution, which
    ``auto`` measures at the run's start (trainer/run/cpu_precision.py)."""
    from trainer.system.cpu_bf16 import bf16_units

    units, chosen = bf16_units(), cfg.training.mixed_precision
    if not units:
        return [Recommendation("Train in fp32 on the CPU", "this CPU has no bf16 units "
                               "(amx_bf16, avx512_bf16): bf16 runs through conversions, slower "
                               "than fp32", {"training.mixed_precision": "no"})] \
            if precision != "no" else []
    why = (f"this CPU has {', '.join(units)}: bf16 base weights trained an SD 1.5-size UNet "
           f"twice as fast as fp32 at 256 px and slower at 64 px; auto measures both on the "
           f"loaded model at the run's resolution and keeps the faster")
    return [Recommendation("Let auto choose bf16 or fp32", why,
                           {"training.mixed_precision": "auto"}, done=chosen == "auto")]


def device_rules(cfg: Any, info: Any, precision: str) -> list[Recommendation]:
    """What this device wants, whatever the memory estimate says."""
    tr, out = cfg.training, []
    if info.backend == "cpu":
        out += _cpu_precision(cfg, precision)
        threads, cores = cpu_threads(info)
        out.append(Recommendation(f"{threads} of {cores} CPU threads", "training leaves a core "
                                  "free only while other processes keep one busy; set "
                                  "OMP_NUM_THREADS before starting to fix the count", done=True))
        return out
    small = info.memory_bytes is not None and info.memory_bytes < SMALL_MEMORY
    if small and not tr.gradient_checkpointing:
        out.append(Recommendation("Turn on gradient checkpointing", "under 16 GB of memory it "
                                  "is the largest saving for about 20-30% more time per step",
                                  {"training.gradient_checkpointing": True}))
    if small and precision == "no" and (info.fp16_ok or info.bf16_ok):
        out.append(Recommendation(f"Use {_half(info)} mixed precision", "under 16 GB, fp32 "
                                  "doubles the weights and the activations",
                                  {"training.mixed_precision": _half(info)}))
    if (is_rdna3(info) or is_big_accelerator(info)) and info.bf16_ok:
        kind = "RDNA3" if is_rdna3(info) else "this accelerator"
        out.append(Recommendation("bf16 mixed precision", f"{kind} computes bf16 at full "
                                  "rate and bf16 does not overflow as fp16 can",
                                  {"training.mixed_precision": "bf16"},
                                  done=precision == "bf16"))
    return out


# The memory changes, least intrusive first: (title, why, changes for this cfg or None).
Change = tuple[str, str, Callable[[Any, Any, str], Optional[dict[str, Any]]]]


def _bnb(cfg: Any, info: Any, precision: str) -> Optional[dict[str, Any]]:
    from trainer.optim.optimizers import BNB_BACKENDS

    eight = {"AdamW": "AdamW8bit", "Lion": "Lion8bit", "PagedAdamW": "PagedAdamW8bit",
             "SGDNesterov": "SGDNesterov8bit"}.get(cfg.optimizer.optimizer_type)
    return {"optimizer.optimizer_type": eight} if eight and info.backend in BNB_BACKENDS \
        else None


def _fp8_base(cfg: Any, info: Any, precision: str) -> Optional[dict[str, Any]]:
    """fp8 storage where it runs well: an adapter on a GPU (the CPU casts fp8 slowly, MPS has
    no fp8). It saves memory in a step only with gradient checkpointing (without it autograd
    keeps every layer's compute copy: trainer/advisor/base_weights.py), which comes first."""
    if cfg.mode == "dreambooth" or cfg.model.base_precision != "full" \
            or info.backend not in ("cuda", "rocm", "xpu"):
        return None
    return {"model.base_precision": "fp8"}


def _halve_batch(cfg: Any, info: Any, precision: str) -> Optional[dict[str, Any]]:
    tr = cfg.training
    if tr.train_batch_size < 2:
        return None
    return {"training.train_batch_size": tr.train_batch_size // 2,
            "training.gradient_accumulation_steps": tr.gradient_accumulation_steps * 2}


def _lower_resolution(cfg: Any, info: Any, precision: str) -> Optional[dict[str, Any]]:
    from trainer.config.sections.resolution import area_side, scaled

    res = cfg.dataset.resolution  # [w, h]: both sides, the aspect ratio kept
    lower = scaled(res, 3 / 4)
    return {"dataset.resolution": lower} if area_side(lower) < area_side(res) else None


MEMORY_CHANGES: tuple[Change, ...] = (
    ("Turn on gradient checkpointing", "recomputes activations in the backward pass instead "
     "of keeping them", lambda c, i, p: None if c.training.gradient_checkpointing
     else {"training.gradient_checkpointing": True}),
    ("Use mixed precision", "halves the frozen weights and the activations",
     lambda c, i, p: {"training.mixed_precision": _half(i)}
     if p == "no" and i.backend != "cpu" and (i.fp16_ok or i.bf16_ok) else None),
    ("Cache the latents", "the VAE encodes each image once before training instead of every "
     "step", lambda c, i, p: None if c.dataset.cache_latents or c.dataset.random_crop
     or c.dataset.color_aug else {"dataset.cache_latents": True}),
    ("Use an 8-bit optimizer", "bitsandbytes keeps the optimizer state in 8 bits", _bnb),
    ("Store the base weights in fp8", "the frozen UNet's Linear and Conv weights in 1 byte, "
     "each layer computed at the training precision (model.base_precision)", _fp8_base),
    ("Keep the trained weights in bf16", "full_bf16: trained weights, gradients and "
     "optimizer state in bf16", lambda c, i, p: {"training.full_bf16": True}
     if p == "bf16" and not c.training.full_bf16 and c.mode == "dreambooth" else None),
    ("Do not train the text encoder", "its gradients, optimizer state and activations go",
     lambda c, i, p: {"network.train_text_encoder": False}
     if c.mode != "textual_inversion" and c.network.train_text_encoder else None),
    ("Halve the batch, double the accumulation", "the same effective batch with half the "
     "activations", _halve_batch),
    ("Lower the resolution", "activations grow with the pixels; this changes what is "
     "learnt", _lower_resolution),
)


def memory_rules(cfg: Any, info: Any, precision: str, peak_of: Callable[[dict], int],
                 capacity: int) -> list[Recommendation]:
    """When the estimate does not fit ``capacity``: what to change first."""
    base = peak_of({})
    candidates = []
    for title, why, make in MEMORY_CHANGES:
        changes = make(cfg, info, precision)
        if changes:
            candidates.append((title, why, changes, base - peak_of(changes)))
    for title, why, changes, saves in candidates:
        if base - saves <= capacity:
            return [Recommendation(f"Change this first: {title.lower()}", why + " - and then "
                                   "it fits", changes, saves)]
    combined: dict[str, Any] = {}
    titles = []
    for title, _, changes, _ in candidates:
        combined.update(changes)
        titles.append(title.lower())
        if peak_of(combined) <= capacity:
            return [Recommendation("Change these: " + "; ".join(titles), "no single change "
                                   "fits; together they do", combined, base - peak_of(combined))]
    tail = " (and switch from DreamBooth to LoRA)" if cfg.mode == "dreambooth" else ""
    return [Recommendation("It does not fit even with every change" + tail,
                           "a smaller model, a smaller resolution or a device with more memory",
                           combined, base - peak_of(combined) if combined else None)]
