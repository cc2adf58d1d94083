"""``python -m trainer doctor``: what torch sees, whether the device computes, and what is wrong.

The report lists the torch build, the CUDA/HIP/XPU versions, the device that training would use,
its memory and precisions, and the result of a small matmul on that device. It then diagnoses the
mismatches people hit most, each as a sentence plus what to do:

1. ROCm is installed but torch is not a ROCm build (``./setup.sh --use-rocm``);
2. an NVIDIA GPU is present but torch is a CPU build, or CUDA cannot use it;
3. a HIP error from the matmul (a GPU architecture that the ROCm build has no kernels for:
   ``HSA_OVERRIDE_GFX_VERSION``, and the ROCm of torch must match the installed ROCm);
4. an Intel GPU runtime is present but torch has no XPU support (``./setup.sh --use-ipex``);
5. a ROCm build of torch where no AMD GPU is usable.

Last, per family, whether a single checkpoint file loads offline: its CLIP tokenizer in the
Hugging Face cache, or the command that fetches it (:mod:`trainer.models.tokenizers`); for
FLUX.1 and SD 3.x each of their tokenizers (CLIP-L, CLIP-G, T5's:
:mod:`trainer.families.common.mmdit_tokenizers`), the Qwen ones and Qwen-Image-Edit's image
processor (:mod:`trainer.families.common.qwen_processor`).

Every look at the system goes through :class:`~trainer.system.probes.Probes`, so tests can
simulate each machine.
Torch itself is only asked through :func:`trainer.system.device.detect`.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import re
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from trainer.system.device import DeviceInfo, detect, format_bytes, resolve_precision
from trainer.system.probes import Probes, SystemFacts, gather_facts

MATMUL_SIZE = 256
HIP_FAILURE = re.compile(r"no binary for gpu|invalid device function|hip error|hiperror", re.I)
# gfx architecture family -> the HSA_OVERRIDE_GFX_VERSION that ROCm builds ship kernels for
GFX_OVERRIDES = {"gfx103": ("10.3.0", "RDNA2, RX 6000"), "gfx110": ("11.0.0", "RDNA3, RX 7000")}


@dataclass(frozen=True)
class MatmulResult:
    ok: bool
    seconds: Optional[float] = None
    error: Optional[str] = None


@dataclass(frozen=True)
class Finding:
    level: str  # "error": the device is unusable; "warning": a GPU goes unused; "note"
    problem: str
    fix: str


@dataclass(frozen=True)
class Report:
    info: DeviceInfo
    matmul: MatmulResult
    facts: SystemFacts
    findings: tuple[Finding, ...]
    models: tuple[tuple[str, str], ...] = ()  # (family, can a single file of it load offline)
    cpu_bf16: str = ""  # the CPU's bf16 units and measured speed (tools/cpu_bf16_report.py)
    model: tuple[str, ...] = ()  # --model: what the path holds (tools/model_report.py)

    @property
    def usable(self) -> bool:
        return self.matmul.ok


def run_matmul(info: DeviceInfo, torch_module: Any = None, size: int = MATMUL_SIZE) -> MatmulResult:
    """Multiply a seeded fp32 matrix on the device and check it against the CPU.

    The time is that of a second multiplication (the first loads the kernels), including the
    copy back to the CPU, which waits for the device.
    """
    torch = torch_module
    if torch is None:
        import torch
    try:
        a_cpu = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
        a = a_cpu.to(info.torch_device)
        (a @ a).to("cpu")
        start = time.perf_counter()
        product = (a @ a).to("cpu")
        seconds = time.perf_counter() - start
        reference = a_cpu @ a_cpu
        error = float((product - reference).abs().max() / reference.abs().max())
    except Exception as exc:  # the point is to turn any failure into a diagnosis
        return MatmulResult(ok=False, error=f"{type(exc).__name__}: {exc}".strip())
    if not error < 1e-2:  # also catches NaN
        return MatmulResult(False, seconds, f"wrong result (relative error {error:.3g})")
    return MatmulResult(ok=True, seconds=seconds)


def diagnose(info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts) -> list[Finding]:
    """The known mismatches between torch, the driver and the hardware, worst first."""
    checks = (_hip_failure, _matmul_failure, _rocm_unused, _rocm_torch_without_gpu,
              _nvidia_unused, _intel_unused)
    findings = [f for check in checks if (f := check(info, matmul, facts)) is not None]
    if info.backend == "cpu" and not findings:
        findings.append(Finding(
            "note", "No usable GPU was found, so training runs on the CPU.",
            "That is fine for the embedded tiny model and slow for a real one.",
        ))
    return findings


def _build(info: DeviceInfo) -> str:
    """What kind of torch this is, for sentences: 'a CUDA 12.8 build', 'a CPU-only build'."""
    if info.hip_version:
        return f"a ROCm build (HIP {info.hip_version})"
    if info.cuda_version:
        return f"a CUDA {info.cuda_version} build"
    if info.xpu_version:
        return f"an XPU build ({info.xpu_version})"
    return "a CPU-only build"


def _gfx_advice(facts: SystemFacts) -> str:
    for gfx in facts.amd_gfx:
        for prefix, (version, family) in GFX_OVERRIDES.items():
            if gfx.startswith(prefix):
                return (f" rocminfo lists {gfx} ({family}): try "
                        f"`HSA_OVERRIDE_GFX_VERSION={version} ./gui.sh`.")
    return ""


def _hip_failure(info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts) -> Optional[Finding]:
    if matmul.ok or not HIP_FAILURE.search(matmul.error or ""):
        return None
    installed = facts.rocm_version or "unknown"
    override = (f" HSA_OVERRIDE_GFX_VERSION is set to {facts.hsa_override}; check that it names "
                "your GPU's family." if facts.hsa_override else "")
    return Finding(
        "error",
        f"The test matmul on {info.name} failed with a HIP error ({matmul.error}): this ROCm "
        "build of torch has no kernels for the GPU's architecture, or its ROCm does not match "
        "the installed one.",
        "For a Radeon that ROCm does not list, set HSA_OVERRIDE_GFX_VERSION to the nearest "
        "supported architecture before starting: 10.3.0 for RDNA2 (RX 6000, gfx103x), 11.0.0 "
        f"for RDNA3 (RX 7000, gfx110x).{_gfx_advice(facts)}{override} The ROCm version of torch "
        f"(HIP {info.hip_version or 'unknown'}) must match the installed ROCm ({installed}); "
        "if they differ, reinstall torch with `./setup.sh --use-rocm`.",
    )


def _matmul_failure(
    info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts
) -> Optional[Finding]:
    if matmul.ok or HIP_FAILURE.search(matmul.error or ""):
        return None
    return Finding(
        "error",
        f"The test matmul on {info.name} ({info.torch_device}) failed: {matmul.error}.",
        "Training on this device would fail too. Update the GPU driver or reinstall torch with "
        "`./setup.sh --force`; to train on the CPU meanwhile, use `./setup.sh --cpu`.",
    )


def _rocm_unused(info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts) -> Optional[Finding]:
    if not facts.rocm_installed or info.hip_version or info.backend == "cuda":
        return None
    found = f"ROCm {facts.rocm_version}" if facts.rocm_version else "ROCm (rocminfo)"
    return Finding(
        "warning",
        f"{found} is installed but torch {info.torch_version} is {_build(info)}, not a ROCm "
        f"build, so the AMD GPU is not used and training runs on the {info.label}.",
        "Reinstall torch for ROCm: `./setup.sh --use-rocm`.",
    )


def _rocm_torch_without_gpu(
    info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts
) -> Optional[Finding]:
    if not info.hip_version or info.backend != "cpu":
        return None
    if not facts.rocm_installed:
        return Finding(
            "warning",
            f"torch {info.torch_version} is {_build(info)} but ROCm is not installed (no "
            "rocminfo), so no AMD GPU is usable and training runs on the CPU.",
            "Install the amdgpu driver and ROCm, or reinstall the CPU build: `./setup.sh --cpu`.",
        )
    return Finding(
        "warning",
        f"torch {info.torch_version} is {_build(info)} and ROCm is installed, but torch sees no "
        "AMD GPU, so training runs on the CPU.",
        "Check that `rocminfo` lists a gfx agent and that your user is in the `render` and "
        "`video` groups; for a Radeon that ROCm does not list, set HSA_OVERRIDE_GFX_VERSION "
        "(10.3.0 for RDNA2, 11.0.0 for RDNA3).",
    )


def _nvidia_unused(info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts) -> Optional[Finding]:
    if not facts.nvidia_gpus or info.backend == "cuda":
        return None
    gpus = ", ".join(facts.nvidia_gpus)
    if not info.cuda_version:
        return Finding(
            "warning",
            f"nvidia-smi lists {gpus} but torch {info.torch_version} is {_build(info)}, so "
            f"training runs on the {info.label}.",
            "Reinstall the CUDA build of torch: `./setup.sh --cuda`.",
        )
    hidden = (f" CUDA_VISIBLE_DEVICES is {facts.cuda_visible_devices!r}; check that it names "
              "a GPU." if facts.cuda_visible_devices is not None else "")
    return Finding(
        "warning",
        f"nvidia-smi lists {gpus} and torch is {_build(info)}, but CUDA cannot use the GPU, so "
        f"training runs on the {info.label}.",
        f"The driver is probably older than CUDA {info.cuda_version} needs (nvidia-smi shows the "
        f"newest CUDA the driver supports): update the NVIDIA driver.{hidden}",
    )


def _intel_unused(info: DeviceInfo, matmul: MatmulResult, facts: SystemFacts) -> Optional[Finding]:
    if not facts.intel_gpu or info.backend != "cpu":
        return None
    if info.xpu_version:
        return Finding(
            "warning",
            f"{facts.intel_gpu} and torch is {_build(info)}, but torch sees no XPU device, so "
            "training runs on the CPU.",
            "Install Intel's GPU driver with the Level Zero runtime (intel-level-zero-gpu, "
            "intel-opencl-icd) and add your user to the `render` group.",
        )
    return Finding(
        "warning",
        f"{facts.intel_gpu} but torch {info.torch_version} is {_build(info)} without XPU "
        "support, so training runs on the CPU.",
        "For an Intel Arc, Data Center GPU Max or Core Ultra GPU, reinstall torch with XPU "
        "support: `./setup.sh --use-ipex`.",
    )


def build_report(probes: Optional[Probes] = None, torch_module: Any = None) -> Report:
    """Detect the device, run the matmul on it, look at the system and diagnose."""
    info = detect(torch_module)
    matmul = run_matmul(info, torch_module)
    facts = gather_facts(probes or Probes())
    from trainer.families.common import mmdit_tokenizers as flow_tokenizers
    from trainer.families.common import qwen_processor, qwen_tokenizers
    from trainer.models import tokenizers

    models = (tokenizers.cache_report() + flow_tokenizers.cache_report()
              + qwen_tokenizers.cache_report() + qwen_processor.cache_report())
    return Report(info, matmul, facts, tuple(diagnose(info, matmul, facts)), tuple(models))


def render(report: Report) -> str:
    """The report as plain text."""
    info, facts = report.info, report.facts
    auto = resolve_precision("auto", info)
    rows = [
        ("Python", f"{platform.python_version()} on {platform.platform()}"),
        ("torch", f"{info.torch_version}, {_build(info)}"),
        ("CUDA / HIP / XPU", " / ".join(
            v or "-" for v in (info.cuda_version, info.hip_version, info.xpu_version))),
        ("Backend", f"{info.label} ({info.torch_device})"),
        ("Device", info.name),
        ("Memory", format_bytes(info.memory_bytes) if info.memory_bytes else "unknown"),
        ("Precision", f"bf16 {_yes(info.bf16_ok)}, fp16 {_yes(info.fp16_ok)}; auto -> "
                      f"{'no (fp32)' if auto == 'no' else auto}"),
        ("Matmul", _matmul_line(report.matmul)),
        ("ROCm", _rocm_line(facts)),
        ("NVIDIA (nvidia-smi)", ", ".join(facts.nvidia_gpus) or "none"),
        ("Intel GPU", facts.intel_gpu or "none"),
    ]
    lines = ["kohya-studio doctor", ""] + [f"  {k:<20}{v}" for k, v in rows] + [""]
    if report.cpu_bf16:
        lines += [report.cpu_bf16, ""]
    if report.model:
        lines += [*report.model, ""]
    if report.models:
        lines += ["  Single .safetensors/.ckpt files load offline with the built-in configs and a "
                  "tokenizer:"] + [f"    {k:<18}{v}" for k, v in report.models] + [""]
    for finding in report.findings:
        lines.append(_wrap(f"[{finding.level}] {finding.problem}", "  ", "    "))
        lines.append(_wrap(f"-> {finding.fix}", "    ", "       "))
    verdict = "the device works" if report.usable else "the device is NOT usable"
    lines += ["" if report.findings else "  No problems found.", f"Result: {verdict}."]
    return "\n".join(lines)


def _wrap(text: str, first: str, rest: str) -> str:
    """Wrap at 100 columns without splitting commands such as `nvidia-smi` or `./setup.sh`."""
    return textwrap.fill(text, 100, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _matmul_line(matmul: MatmulResult) -> str:
    if matmul.ok:
        return f"ok ({MATMUL_SIZE}x{MATMUL_SIZE} fp32, {matmul.seconds * 1000:.2f} ms)"
    return f"FAILED: {matmul.error}"


def _rocm_line(facts: SystemFacts) -> str:
    if not facts.rocm_installed:
        return "not installed"
    parts = [facts.rocm_version or "installed", ", ".join(facts.amd_gfx) or "no gfx agent"]
    if facts.hsa_override:
        parts.append(f"HSA_OVERRIDE_GFX_VERSION={facts.hsa_override}")
    return "; ".join(parts)


def main(
    argv: Optional[Sequence[str]] = None, *, probes: Optional[Probes] = None,
    torch_module: Any = None,
) -> int:
    """Print the report; 0 when the device computed correctly (even with warnings), else 1.

    ``argv`` are the arguments after ``doctor``; None means none (not ``sys.argv``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m trainer doctor",
        description="Report the torch build and the training device, test it with a small "
                    "matmul, and explain known driver/torch mismatches.",
    )
    parser.add_argument("--model", metavar="PATH",
                        help="also say which family a base model (a diffusers folder or a "
                             ".safetensors file) is, as train and advise read it, and which "
                             "of its parts the file holds")
    args = parser.parse_args(list(argv) if argv is not None else [])
    report = build_report(probes, torch_module)
    if args.model:
        from trainer.tools.model_report import model_lines

        report = dataclasses.replace(report, model=tuple(model_lines(args.model)))
    if torch_module is None:  # the real CPU: its bf16 units and measured ratios
        from trainer.tools.cpu_bf16_report import cpu_bf16_report

        report = dataclasses.replace(report, cpu_bf16=cpu_bf16_report())
    print(render(report))
    return 0 if report.usable else 1
