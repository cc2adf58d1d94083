"""The doctor: each known mismatch on a simulated machine, and one real run on this one."""

from __future__ import annotations

import os
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainer.system.device import DeviceInfo
from trainer.tools import doctor
from trainer.tools.doctor import MatmulResult, Probes, SystemFacts, diagnose, gather_facts

ROCMINFO_OUT = """\
Agent 1
  Name:                    AMD Ryzen 9 7950X
Agent 2
  Name:                    gfx1031
  Marketing Name:          AMD Radeon RX 6700 XT
      Name:                    amdgcn-amd-amdhsa--gfx1031
"""
NVIDIA_SMI_OUT = """\
GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0f3c5e2a-1111-2222-3333-444455556666)
GPU 1: NVIDIA H200 (UUID: GPU-aaaa)
"""
ROCM_FILES = {"/opt/rocm/.info/version": "6.4.1-120\n"}
INTEL_FILES = {"/dev/dri/renderD128": "", "/sys/class/drm/renderD128/device/vendor": "0x8086\n"}


def fake_probes(commands=(), files=None, env=None, on_path=None):
    """A simulated system: ``commands`` maps a program to its stdout (None: it fails)."""
    commands = dict(commands)
    files = dict(files or {})
    on_path = set(commands) if on_path is None else set(on_path)
    return Probes(
        which=lambda name: f"/usr/bin/{name}" if name in on_path else None,
        exists=lambda path: path in files,
        glob=lambda pattern: [path for path in files if fnmatch(path, pattern)],
        read_text=files.get,
        run=lambda cmd: commands.get(os.path.basename(cmd[0])),
        env=dict(env or {}),
    )


def make_info(backend="cpu", **versions):
    return DeviceInfo(
        backend=backend, name="GPU" if backend != "cpu" else "AMD EPYC",
        torch_device="cpu" if backend == "cpu" else "cuda:0", memory_bytes=2**34, bf16_ok=True,
        fp16_ok=backend != "cpu", torch_version="2.13.0", **versions,
    )


OK = MatmulResult(ok=True, seconds=0.001)


def run_main(capsys, probes, torch_module=None):
    code = doctor.main([], probes=probes, torch_module=torch_module)
    return code, capsys.readouterr().out


def test_real_run_on_this_machine(capsys):
    code = doctor.main()
    out = capsys.readouterr().out
    assert code == 0
    assert "Backend             CPU (cpu)" in out
    assert "torch               2.13.0" in out
    assert "Matmul              ok (256x256 fp32," in out
    assert out.rstrip().endswith("Result: the device works.")


def test_gather_facts_reads_rocm_nvidia_and_env():
    probes = fake_probes(
        {"rocminfo": ROCMINFO_OUT, "nvidia-smi": NVIDIA_SMI_OUT}, ROCM_FILES,
        env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0", "CUDA_VISIBLE_DEVICES": "1"},
    )
    facts = gather_facts(probes)
    assert facts.rocm_installed and facts.rocm_version == "6.4.1-120"
    assert facts.amd_gfx == ("gfx1031",)
    assert facts.nvidia_gpus == ("NVIDIA GeForce RTX 4090", "NVIDIA H200")
    assert (facts.hsa_override, facts.cuda_visible_devices) == ("10.3.0", "1")
    assert facts.intel_gpu is None


def test_rocminfo_under_opt_rocm_counts_when_not_on_path():
    files = {"/opt/rocm/bin/rocminfo": "", **ROCM_FILES}
    facts = gather_facts(fake_probes({"rocminfo": ROCMINFO_OUT}, files, on_path=()))
    assert facts.rocm_installed and facts.amd_gfx == ("gfx1031",)
    assert not gather_facts(fake_probes()).rocm_installed


def test_rocm_installed_but_cpu_torch(capsys):
    code, out = run_main(capsys, fake_probes({"rocminfo": ROCMINFO_OUT}, ROCM_FILES))
    assert code == 0  # the CPU still works: a warning, not a failure
    flat = " ".join(out.split())
    assert "[warning] ROCm 6.4.1-120 is installed but torch 2.13.0+cpu is a CPU-only build" in flat
    assert "`./setup.sh --use-rocm`" in flat
    assert "6.4.1-120; gfx1031" in out


def test_rocm_installed_is_fine_when_cuda_works():
    facts = SystemFacts(rocm_installed=True)
    assert diagnose(make_info("cuda", cuda_version="12.8"), OK, facts) == []


def test_nvidia_gpu_but_cpu_torch(capsys):
    code, out = run_main(capsys, fake_probes({"nvidia-smi": NVIDIA_SMI_OUT}))
    assert code == 0
    flat = " ".join(out.split())
    assert ("[warning] nvidia-smi lists NVIDIA GeForce RTX 4090, NVIDIA H200 but torch "
            "2.13.0+cpu is a CPU-only build") in flat
    assert "Reinstall the CUDA build of torch: `./setup.sh --cuda`." in flat


def test_nvidia_gpu_with_cuda_torch_that_cannot_use_it():
    facts = SystemFacts(nvidia_gpus=("NVIDIA GeForce RTX 3060",), cuda_visible_devices="")
    [finding] = diagnose(make_info("cpu", cuda_version="12.8"), OK, facts)
    assert finding.level == "warning"
    assert "torch is a CUDA 12.8 build, but CUDA cannot use the GPU" in finding.problem
    assert "older than CUDA 12.8 needs" in finding.fix
    assert "CUDA_VISIBLE_DEVICES is ''" in finding.fix


def test_failing_nvidia_smi_lists_no_gpu():
    facts = gather_facts(fake_probes({"nvidia-smi": None}))
    assert facts.nvidia_gpus == ()
    [finding] = diagnose(make_info("cpu"), OK, facts)
    assert finding.level == "note" and "runs on the CPU" in finding.problem


class HostTensor:
    """A CPU tensor whose copy to the simulated GPU misbehaves as ``mode`` says."""

    def __init__(self, value, mode):
        self.value, self.mode = value, mode

    def to(self, device):
        return DeviceTensor(self.value, self.mode)

    def __matmul__(self, other):
        return self.value @ other.value


class DeviceTensor(HostTensor):
    def __matmul__(self, other):
        if self.mode.startswith("raise:"):
            raise RuntimeError(self.mode.removeprefix("raise:"))
        product = self.value @ other.value
        return DeviceTensor(product * float("nan") if self.mode == "nan" else product, self.mode)

    def to(self, device):
        assert device == "cpu"
        return self.value


def rocm_torch(mode):
    return SimpleNamespace(
        __version__="2.13.0+rocm6.4",
        version=SimpleNamespace(cuda=None, hip="6.4.43482", xpu=None),
        cuda=SimpleNamespace(
            is_available=lambda: True, get_device_name=lambda index=0: "AMD Radeon RX 6700 XT",
            get_device_properties=lambda index=0: SimpleNamespace(total_memory=12 * 2**30),
            is_bf16_supported=lambda including_emulation=True: True,
        ),
        randn=lambda *shape, generator: HostTensor(torch.randn(*shape, generator=generator), mode),
        Generator=torch.Generator,
    )


def test_hip_failure_explains_hsa_override_and_rocm_match(capsys):
    probes = fake_probes({"rocminfo": ROCMINFO_OUT}, ROCM_FILES)
    torch_module = rocm_torch("raise:HIP error: invalid device function")
    code, out = run_main(capsys, probes, torch_module)
    assert code == 1
    assert "Backend             ROCm (cuda:0)" in out
    assert "FAILED: RuntimeError: HIP error: invalid device function" in out
    flat = " ".join(out.split())
    assert "[error] The test matmul on AMD Radeon RX 6700 XT failed with a HIP error" in flat
    assert "10.3.0 for RDNA2 (RX 6000, gfx103x), 11.0.0 for RDNA3 (RX 7000, gfx110x)" in flat
    assert "rocminfo lists gfx1031 (RDNA2, RX 6000): try `HSA_OVERRIDE_GFX_VERSION=10.3.0" in flat
    assert "(HIP 6.4.43482) must match the installed ROCm (6.4.1-120)" in flat
    assert "Result: the device is NOT usable." in out


@pytest.mark.parametrize("error", [
    "RuntimeError: HIP error: no binary for GPU",
    "RuntimeError: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
    "RuntimeError: invalid device function",
])
def test_each_hip_failure_text_is_recognised(error):
    facts = SystemFacts(rocm_installed=True, hsa_override="11.0.0")
    [finding] = diagnose(make_info("rocm", hip_version="6.4"), MatmulResult(False, error=error),
                         facts)
    assert finding.level == "error" and "HIP error" in finding.problem
    assert "HSA_OVERRIDE_GFX_VERSION is set to 11.0.0" in finding.fix


def test_other_matmul_failure_is_an_error(capsys):
    torch_module = rocm_torch("raise:CUDA error: no kernel image is available")
    torch_module.version.hip = None
    torch_module.version.cuda = "12.8"
    code, out = run_main(capsys, fake_probes(), torch_module)
    assert code == 1
    assert "[error] The test matmul on AMD Radeon RX 6700 XT (cuda:0) failed: RuntimeError: " \
           "CUDA error: no kernel image is available." in " ".join(out.split())
    assert "HSA_OVERRIDE" not in out


def test_wrong_matmul_result_makes_the_device_unusable(capsys):
    code, out = run_main(capsys, fake_probes(), rocm_torch("nan"))
    assert code == 1
    assert "FAILED: wrong result (relative error nan)" in out


def test_intel_render_node_but_cpu_torch(capsys):
    code, out = run_main(capsys, fake_probes(files=INTEL_FILES))
    assert code == 0
    flat = " ".join(out.split())
    assert ("[warning] /dev/dri/renderD128 is an Intel GPU (vendor 0x8086) but torch "
            "2.13.0+cpu is a CPU-only build without XPU support") in flat
    assert "`./setup.sh --use-ipex`" in flat


@pytest.mark.parametrize(("commands", "files", "found"), [
    ({"sycl-ls": "[level_zero:gpu][level_zero:0] Intel(R) Level-Zero, Intel(R) Arc(TM) A770"},
     {}, "sycl-ls lists a Level Zero GPU"),
    ({"sycl-ls": "[opencl:cpu][opencl:0] Intel(R) OpenCL, AMD EPYC"}, {}, None),
    ({"xpu-smi": ""}, {}, "xpu-smi is installed"),
    ({}, {"/dev/dri/renderD128": "", "/sys/class/drm/renderD128/device/vendor": "0x10de\n"},
     None),
])
def test_intel_runtime_detection(commands, files, found):
    assert gather_facts(fake_probes(commands, files)).intel_gpu == found


def test_intel_gpu_with_xpu_torch_that_sees_no_device():
    facts = SystemFacts(intel_gpu="xpu-smi is installed")
    [finding] = diagnose(make_info("cpu", xpu_version="20250101"), OK, facts)
    assert "torch sees no XPU device" in finding.problem
    assert "Level Zero runtime" in finding.fix


def test_intel_igpu_is_ignored_when_a_gpu_works():
    facts = SystemFacts(intel_gpu="/dev/dri/renderD128 is an Intel GPU (vendor 0x8086)")
    assert diagnose(make_info("cuda", cuda_version="12.8"), OK, facts) == []


@pytest.mark.parametrize(("rocm_installed", "fix"), [
    (False, "`./setup.sh --cpu`"), (True, "`render` and `video` groups"),
])
def test_rocm_torch_without_usable_gpu(rocm_installed, fix):
    facts = SystemFacts(rocm_installed=rocm_installed)
    [finding] = diagnose(make_info("cpu", hip_version="6.4.43482"), OK, facts)
    assert "is a ROCm build (HIP 6.4.43482)" in finding.problem
    assert fix in finding.fix


def test_lists_the_families_a_single_file_loads_offline(capsys, tmp_path, monkeypatch):
    """Configs ship with the studio; the tokenizer in the Hugging Face cache decides."""
    import huggingface_hub.constants

    from trainer.families.sd.tiny import write_tokenizer_files
    from trainer.models.tokenizers import CLIP_L, FETCH

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    code, out = run_main(capsys, fake_probes())
    assert code == 0 and "Single .safetensors/.ckpt files load offline" in out
    for label in ("SD 1.x", "SD 2.x", "SDXL"):
        assert f"    {label:<18}tokenizer not found: {FETCH}\n" in out
    repo = tmp_path / ("models--" + CLIP_L.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    write_tokenizer_files(repo / "snapshots" / ("a" * 40))
    code, out = run_main(capsys, fake_probes())
    for label in ("SD 1.x", "SD 2.x", "SDXL"):
        assert f"    {label:<18}ready, tokenizer from the Hugging Face cache ({CLIP_L})\n" in out
    assert out.rstrip().endswith("Result: the device works.")


def test_lists_the_flow_families_tokenizers_clip_and_t5(capsys, tmp_path, monkeypatch):
    """FLUX.1 and SD 3.x rows beside the CLIP ones: each encoder's tokenizer (CLIP-L, CLIP-G,
    T5) in the Hugging Face cache, or the one command that fetches what is missing."""
    import huggingface_hub.constants

    from trainer.families.common.mmdit_tokenizers import SCHNELL, T5_FETCH
    from trainer.families.common.tiny_mmdit import build_t5_tokenizer
    from trainer.families.sd.tiny import write_tokenizer_files
    from trainer.models.tokenizers import CLIP_L, FETCH

    def cached(repo: str) -> Path:
        folder = tmp_path / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text("a" * 40)
        return folder / "snapshots" / ("a" * 40)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    code, out = run_main(capsys, fake_probes())
    assert code == 0
    assert (f"    {'FLUX.1':<18}CLIP-L tokenizer not found: {FETCH}; "
            f"T5 tokenizer not found: {T5_FETCH}\n") in out
    assert (f"    {'SD 3 / 3.5':<18}CLIP-L, CLIP-G tokenizer not found: {FETCH}; "
            f"T5 tokenizer not found: {T5_FETCH}\n") in out

    write_tokenizer_files(cached(CLIP_L))  # CLIP's vocabulary serves CLIP-L and CLIP-G
    code, out = run_main(capsys, fake_probes())
    clip = f"from the Hugging Face cache ({CLIP_L})"
    assert f"    {'FLUX.1':<18}T5 tokenizer not found: {T5_FETCH}; CLIP-L {clip}\n" in out
    assert f"    {'SDXL':<18}ready, tokenizer {clip}\n" in out

    build_t5_tokenizer().save_pretrained(cached(SCHNELL) / "tokenizer_2")
    code, out = run_main(capsys, fake_probes())
    t5 = f"T5 from the Hugging Face cache ({SCHNELL}/tokenizer_2)"
    assert f"    {'FLUX.1':<18}ready, CLIP-L {clip}; {t5}\n" in out
    assert f"    {'SD 3 / 3.5':<18}ready, CLIP-L {clip}; CLIP-G {clip}; {t5}\n" in out
    assert out.rstrip().endswith("Result: the device works.")
