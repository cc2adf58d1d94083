"""Device detection for every backend (simulated torch), precision resolution and refusals."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.system import device
from trainer.system.device import (
    DeviceInfo,
    PrecisionError,
    check_full_bf16,
    detect,
    empty_cache,
    resolve_precision,
)

H200_BYTES = 150_110_011_392  # what torch reports as total_memory for an H200


def _unavailable():
    return SimpleNamespace(is_available=lambda: False)


def fake_torch(version="2.13.0", cuda=None, hip=None, xpu_version=None, **parts):
    """A stand-in for the torch module: only the attributes that device.py reads."""
    namespace = SimpleNamespace(
        __version__=version,
        version=SimpleNamespace(cuda=cuda, hip=hip, xpu=xpu_version),
        cuda=parts.pop("cuda_ns", _unavailable()),
        xpu=parts.pop("xpu_ns", _unavailable()),
        backends=SimpleNamespace(mps=parts.pop("mps_ns", _unavailable())),
        mps=parts.pop("mps_module", SimpleNamespace()),
    )
    assert not parts, parts
    return namespace


def cuda_ns(name, memory=H200_BYTES, bf16=True, calls=None):
    def is_bf16_supported(including_emulation=True):
        if calls is not None:
            calls.append(including_emulation)
        return bf16

    return SimpleNamespace(
        is_available=lambda: True,
        get_device_name=lambda index=0: name,
        get_device_properties=lambda index=0: SimpleNamespace(total_memory=memory),
        is_bf16_supported=is_bf16_supported,
    )


def info(backend="cuda", bf16_ok=True, fp16_ok=True, name="NVIDIA H200", torch_version="2.13.0"):
    return DeviceInfo(
        backend=backend, name=name, torch_device="cpu", memory_bytes=None, bf16_ok=bf16_ok,
        fp16_ok=fp16_ok, torch_version=torch_version,
    )


def test_detect_cuda_h200():
    calls: list = []
    found = detect(fake_torch("2.13.0+cu128", cuda="12.8", cuda_ns=cuda_ns("NVIDIA H200",
                                                                            calls=calls)))
    assert (found.backend, found.name, found.torch_device) == ("cuda", "NVIDIA H200", "cuda:0")
    assert found.memory_bytes == H200_BYTES
    assert found.bf16_ok and found.fp16_ok
    assert (found.cuda_version, found.hip_version, found.xpu_version) == ("12.8", None, None)
    assert calls == [False]  # emulated bf16 does not count
    assert found.summary() == "CUDA · NVIDIA H200 · 139.8 GiB · bf16"


def test_detect_cuda_without_native_bf16_picks_fp16():
    found = detect(fake_torch(cuda="12.1", cuda_ns=cuda_ns("Tesla T4", 15 * 2**30, bf16=False)))
    assert not found.bf16_ok
    assert resolve_precision("auto", found) == "fp16"
    assert found.summary() == "CUDA · Tesla T4 · 15.0 GiB · fp16"


def test_detect_cuda_on_torch_without_including_emulation():
    ns = cuda_ns("NVIDIA GeForce RTX 3090")
    ns.is_bf16_supported = lambda: True  # torch < 2.3 signature
    assert detect(fake_torch("2.1.0", cuda="12.1", cuda_ns=ns)).bf16_ok


def test_detect_cuda_with_broken_properties_still_detects():
    ns = cuda_ns("NVIDIA GeForce RTX 4090")

    def broken(index=0):
        raise RuntimeError("CUDA driver error")

    ns.get_device_properties = broken
    found = detect(fake_torch(cuda="12.8", cuda_ns=ns))
    assert found.backend == "cuda" and found.memory_bytes is None
    assert found.summary() == "CUDA · NVIDIA GeForce RTX 4090 · bf16"


def test_detect_rocm():
    ns = cuda_ns("AMD Radeon RX 7900 XTX", memory=24 * 2**30)
    found = detect(fake_torch("2.13.0+rocm6.4", hip="6.4.43482", cuda_ns=ns))
    assert (found.backend, found.torch_device) == ("rocm", "cuda:0")
    assert found.hip_version == "6.4.43482" and found.cuda_version is None
    assert found.summary() == "ROCm · AMD Radeon RX 7900 XTX · 24.0 GiB · bf16"


def test_rocm_build_without_gpu_is_cpu():
    found = detect(fake_torch("2.13.0+rocm6.4", hip="6.4.43482"))
    assert found.backend == "cpu" and found.hip_version == "6.4.43482"


def test_detect_xpu():
    ns = SimpleNamespace(
        is_available=lambda: True,
        get_device_name=lambda index=0: "Intel(R) Arc(TM) A770 Graphics",
        get_device_properties=lambda index=0: SimpleNamespace(total_memory=16 * 2**30),
        is_bf16_supported=lambda: False,
    )
    found = detect(fake_torch("2.13.0+xpu", xpu_version="20250101", xpu_ns=ns))
    assert (found.backend, found.torch_device, found.xpu_version) == ("xpu", "xpu:0", "20250101")
    assert found.name == "Intel(R) Arc(TM) A770 Graphics" and found.memory_bytes == 16 * 2**30
    assert not found.bf16_ok and resolve_precision("auto", found) == "fp16"
    del ns.is_bf16_supported  # older torch.xpu: assume bf16 (every Intel XPU has it)
    assert detect(fake_torch("2.5.0+xpu", xpu_ns=ns)).bf16_ok


def mps_torch(version, macos14=True):
    return fake_torch(
        version,
        mps_ns=SimpleNamespace(
            is_available=lambda: True, get_name=lambda: "Apple M3 Max",
            is_macos_or_newer=lambda major, minor: macos14 or (major, minor) < (14, 0),
        ),
        mps_module=SimpleNamespace(recommended_max_memory=lambda: 96 * 2**30),
    )


def test_detect_mps():
    found = detect(mps_torch("2.13.0"))
    assert (found.backend, found.torch_device, found.name) == ("mps", "mps", "Apple M3 Max")
    assert found.memory_bytes == 96 * 2**30
    assert found.bf16_ok and found.fp16_ok
    assert resolve_precision("auto", found) == "no"
    assert found.summary() == "MPS · Apple M3 Max · 96.0 GiB · fp32"


@pytest.mark.parametrize(
    ("version", "macos14", "bf16", "fp16"),
    [("2.4.1", True, False, False), ("2.5.1", True, False, True), ("2.13.0", False, False, True)],
)
def test_mps_precisions_follow_accelerate_and_macos(version, macos14, bf16, fp16):
    found = detect(mps_torch(version, macos14))
    assert (found.bf16_ok, found.fp16_ok) == (bf16, fp16)


def test_detect_cpu_when_nothing_is_available():
    torch = fake_torch("2.13.0+cpu")
    del torch.xpu  # torch builds before 2.4 have no torch.xpu at all
    found = detect(torch)
    assert (found.backend, found.torch_device) == ("cpu", "cpu")
    assert found.name == device.cpu_name() and found.memory_bytes == device.system_memory()
    assert found.bf16_ok and not found.fp16_ok


def test_detect_real_torch_on_this_machine():
    found = detect()
    assert found.backend == "cpu" and found.torch_version.startswith("2.13.0")
    assert found.name and found.memory_bytes and found.memory_bytes > 2**30
    assert found.summary().startswith(f"CPU · {found.name} · ")


@pytest.mark.parametrize(
    ("backend", "bf16_ok", "fp16_ok", "expected"),
    [
        ("cuda", True, True, "bf16"), ("cuda", False, True, "fp16"),
        ("rocm", True, True, "bf16"), ("xpu", True, True, "bf16"), ("xpu", False, True, "fp16"),
        ("mps", True, True, "no"), ("cpu", True, False, "no"),
    ],
)
def test_auto_precision(backend, bf16_ok, fp16_ok, expected):
    assert resolve_precision("auto", info(backend, bf16_ok, fp16_ok)) == expected


@pytest.mark.parametrize(
    ("requested", "backend", "expected"),
    [("no", "cpu", "no"), ("bf16", "cpu", "bf16"), ("fp16", "cuda", "fp16"),
     ("bf16", "cuda", "bf16"), ("fp16", "mps", "fp16")],
)
def test_explicit_precision_that_the_device_can_do(requested, backend, expected):
    assert resolve_precision(requested, info(backend, fp16_ok=backend != "cpu")) == expected


def test_fp16_on_cpu_is_refused():
    with pytest.raises(PrecisionError) as err:
        resolve_precision("fp16", info("cpu", fp16_ok=False))
    assert str(err.value) == (
        "mixed_precision = 'fp16' is not supported on the CPU (accelerate would silently run "
        "fp32); use 'no' or 'bf16'"
    )


def test_bf16_without_native_support_is_refused():
    with pytest.raises(PrecisionError, match=re.escape(
        "mixed_precision = 'bf16' is not supported on Tesla T4 (CUDA) (no native bf16; NVIDIA "
        "needs compute capability 8.0, Ampere, or newer); use 'no' or 'fp16'"
    )):
        resolve_precision("bf16", info("cuda", bf16_ok=False, name="Tesla T4"))


def test_mps_precisions_refused_on_old_torch():
    old = info("mps", bf16_ok=False, fp16_ok=False, name="Apple M1", torch_version="2.4.1")
    for requested in ("fp16", "bf16"):
        with pytest.raises(PrecisionError, match=r"torch 2\.4\.1 .*; use 'no'$"):
            resolve_precision(requested, old)


def test_unknown_precision_is_refused():
    with pytest.raises(PrecisionError, match="'fp8' is not one of 'auto', 'no', 'fp16', 'bf16'"):
        resolve_precision("fp8", info())
    assert issubclass(PrecisionError, ValueError)


def test_full_bf16_needs_bf16():
    check_full_bf16(True, "bf16")
    check_full_bf16(False, "no")
    for precision in ("no", "fp16"):
        with pytest.raises(PrecisionError, match=f"precision is '{precision}'; set training"):
            check_full_bf16(True, precision)
    with pytest.raises(ValueError, match="resolve the precision first"):
        check_full_bf16(True, "auto")


@pytest.mark.parametrize(
    ("backend", "module"), [("cuda", "cuda"), ("rocm", "cuda"), ("xpu", "xpu"), ("mps", "mps")]
)
def test_empty_cache_calls_the_backend(backend, module, monkeypatch):
    calls = []
    monkeypatch.setattr(device.gc, "collect", lambda: calls.append("gc"))
    torch = SimpleNamespace(**{
        name: SimpleNamespace(empty_cache=lambda name=name: calls.append(name))
        for name in ("cuda", "xpu", "mps")
    })
    empty_cache(info(backend), torch)
    assert calls == ["gc", module]


def test_empty_cache_on_cpu_only_collects(monkeypatch):
    calls = []
    monkeypatch.setattr(device.gc, "collect", lambda: calls.append("gc"))
    empty_cache(info("cpu"), SimpleNamespace())  # touching any torch attribute would raise
    assert calls == ["gc"]


def test_format_bytes():
    assert device.format_bytes(512) == "512 B"
    assert device.format_bytes(3 * 2**20) == "3.0 MiB"
    assert device.format_bytes(H200_BYTES) == "139.8 GiB"


def test_only_device_py_probes_the_backends():
    """House rule: no other module of the app asks torch about the accelerator."""
    root = Path(__file__).resolve().parents[1]
    probe = re.compile(r"torch\.(cuda|xpu|mps|backends\.mps|version\.(hip|cuda|xpu))\b")
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("trainer", "kohya_gui") if (root / folder).is_dir()
        for path in sorted((root / folder).rglob("*.py"))
        if path != root / "trainer/system/device.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if probe.search(line)
    ]
    assert offenders == []
