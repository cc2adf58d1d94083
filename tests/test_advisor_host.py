"""The advisor's host memory (RAM) phase by phase: on the full-size FLUX.1-dev file set as users
download it (the four files' headers, their data sparse: nothing is read but the headers), on a
tiny FLUX.1 file against a real run's measured peak, and the counts against what the loader
stores."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from test_flow_train import single_file_model
from train_helpers import one_image_dataset

from trainer.advisor.advice import GIB
from trainer.advisor.estimate import advise
from trainer.advisor.report import advice_markdown, summary
from trainer.config.files import from_dict
from trainer.system.device import DeviceInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
CARD_24GB = DeviceInfo(backend="cuda", name="NVIDIA GeForce RTX 4090", torch_device="cuda:0",
                       memory_bytes=24 * GIB, bf16_ok=True, fp16_ok=True,
                       torch_version="2.13.0")


def _cpu(ram_gib: float) -> DeviceInfo:
    return DeviceInfo(backend="cpu", name="a CPU", torch_device="cpu",
                      memory_bytes=int(ram_gib * GIB), bf16_ok=False, fp16_ok=False,
                      torch_version="2.13.0")


@pytest.fixture(scope="module")
def full_size(tmp_path_factory):
    """FLUX.1-dev's four files (BFL's fp8 transformer, ae, clip_l, T5-XXL fp8) with the
    published key names, shapes and dtypes (bench/flux_full_size.py's layouts), sparse: the
    header, then a hole of the data's size."""
    from flux_full_size import FILES, SAFETENSORS_DTYPES, _layouts, _meta_parts

    folder = tmp_path_factory.mktemp("fluxfull")
    sizes = {"float8_e4m3fn": 1, "bfloat16": 2, "float16": 2, "float32": 4}
    for name, layout in _layouts(_meta_parts()).items():
        header, offset = {}, 0
        for key, (shape, dtype) in layout.items():
            end = offset + math.prod(shape) * sizes[dtype]
            header[key] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                           "data_offsets": [offset, end]}
            offset = end
        raw = json.dumps(header).encode()
        with open(folder / name, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            f.truncate(8 + len(raw) + offset)
    return {part: str(folder / file) for part, file in FILES.items()}


def _config(tmp_path, files, **model):
    data = tmp_path / "data"
    one_image_dataset(data)
    return from_dict({
        "mode": "lora",
        "model": {"pretrained_model_name_or_path": files["transformer"], "ae": files["ae"],
                  "clip_l": files["clip_l"], "t5xxl": files["t5xxl"],
                  "model_version": "auto", "base_precision": "fp8",
                  "fp8_text_encoders": True, "t5xxl_max_token_length": 128, **model},
        "dataset": {"train_data_dir": str(data), "resolution": 64, "min_bucket_reso": 64,
                    "max_bucket_reso": 64},
        "network": {"network_dim": 4, "network_alpha": 4},
        "training": {"max_train_steps": 1, "mixed_precision": "no",
                     "gradient_checkpointing": True},
        "saving": {"output_dir": str(tmp_path / "out")}})


def test_the_full_size_set_is_held_phase_by_phase_as_the_run_holds_it(tmp_path, full_size):
    """Text first: T5-XXL in fp8 (4.6 GiB of its 4.9 GB) with CLIP-L and the VAE in fp32 while
    it loads and encodes, then the transformer in fp8 (11.1 GiB) without them; on a 24 GiB
    machine it fits, on a 12 GiB one it does not, and the report says so."""
    cfg = _config(tmp_path, full_size)
    advice = advise(cfg, _cpu(23.5))
    assert not advice.problems, advice.problems
    phases = {p.name: p for p in advice.phases}
    assert list(phases) == ["load", "text cache", "transformer", "latent cache", "step"]
    load = dict(phases["load"].lines)
    t5 = next(b for what, b in load.items() if what.startswith("t5xxl"))
    assert 4.4 * GIB < t5 < 4.9 * GIB  # the Linear weights in fp8, the embedding in fp32
    assert not any(what.startswith("transformer") for what in load)  # built after the cache
    assert 5.5 * GIB < phases["load"].host < 7 * GIB
    assert not any(what.startswith("t5xxl") for what, _ in phases["transformer"].lines)
    assert 11 * GIB < phases["transformer"].host < 13 * GIB
    assert 13 * GIB < phases["step"].host < 15 * GIB  # measured here: 13.77 GiB
    assert advice.memory.peak == advice.host_peak().host and advice.fits_ram

    small = advise(cfg, _cpu(12))
    assert not small.fits_ram
    assert any(p.startswith("does not fit in RAM: the step phase") for p in small.problems)
    assert "does not fit in RAM" in summary(small)
    assert "| transformer |" in advice_markdown(small, cfg)


def test_without_text_first_the_load_holds_both(tmp_path, full_size):
    """Sample prompts need T5 during the run: the transformer loads beside it, and stays
    beside it on the CPU."""
    cfg = _config(tmp_path, full_size)
    first = {p.name: p.host for p in advise(cfg, _cpu(23.5)).phases}
    cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(
        update={"sample_prompts": ["a red square"]})})
    both = {p.name: p.host for p in advise(cfg, _cpu(23.5)).phases}
    assert "transformer" not in both
    assert both["load"] > first["transformer"] + 4 * GIB
    assert both["step"] > first["step"] + 4 * GIB


def test_a_gpu_run_reports_the_device_and_the_host(tmp_path, full_size):
    """On a card the host holds the load, then what left the device; block swap's blocks
    stay in host memory."""
    cfg = _config(tmp_path, full_size, base_precision="fp8")
    advice = advise(cfg, CARD_24GB)
    phases = {p.name: p for p in advice.phases}
    assert phases["step"].device == advice.memory.peak
    assert phases["step"].host < 1 * GIB
    assert phases["text cache"].device > 4 * GIB  # T5 and CLIP on the card to encode
    swapped = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"blocks_to_swap": 16})})
    step = {p.name: p for p in advise(swapped, CARD_24GB).phases}["step"]
    held = dict(step.lines)["swapped blocks (pinned)"]  # 16 single blocks: 2.1 GiB in fp8
    assert 2 * GIB < held < 2.5 * GIB and step.host == phases["step"].host + held
    assert step.device < phases["step"].device - 1.5 * GIB


def test_the_header_counts_equal_what_the_loader_stores_in_fp8(tmp_path):
    """The T5 file's fp8-held weights counted from its header are the ones the loader puts in
    fp8 (model.fp8_text_encoders), element for element."""
    from trainer.advisor.host_memory import model_parts
    from trainer.config import ModelSection
    from trainer.families.common.mmdit_single_file import load_flow_components
    from trainer.models.memory import FP8

    model = single_file_model(tmp_path, "flux1")
    parts = model_parts(ModelSection(**model, model_version="auto"), "flux1")
    loaded = load_flow_components(model["pretrained_model_name_or_path"], ae=model["ae"],
                                  clip_l=model["clip_l"], t5xxl=model["t5xxl"],
                                  config_dir=model["config_dir"], tokenizer=model["tokenizer"],
                                  fp8_t5=True)
    t5 = loaded["text_encoder_2"]
    stored = sum(p.numel() for p in t5.parameters() if p.dtype == FP8)
    assert parts["t5xxl"].fp8 == stored > 0
    assert parts["t5xxl"].params == sum(p.numel() for p in t5.parameters())  # tied once
    assert parts["vae"].params == sum(p.numel() for p in loaded["vae"].parameters())


def test_the_load_phase_is_within_10_percent_of_a_real_runs_peak(tmp_path):
    """The tiny FLUX.1 file (BFL's layout, separate ae / clip_l / t5xxl) trained to step 1 in
    a process of its own: its load phase's peak RSS against the advisor's (bench/
    host_phases.py prints every phase)."""
    from host_phases import estimated_phases, measure_phases

    model = single_file_model(tmp_path, "flux1")
    data = tmp_path / "data"
    one_image_dataset(data)
    overrides = [f"model.{k}={json.dumps(v)}" for k, v in model.items()] + [
        'model.base_precision="fp8"', "model.fp8_text_encoders=true",
        "model.t5xxl_max_token_length=16", f"dataset.train_data_dir={json.dumps(str(data))}",
        "dataset.resolution=64", "dataset.min_bucket_reso=64", "dataset.max_bucket_reso=64",
        "training.max_train_steps=1", 'training.mixed_precision="no"',
        'training.log_with="none"', "sampling.sample_prompts=[]",
        f"saving.output_dir={json.dumps(str(tmp_path / 'out'))}"]
    preset = str(ROOT / "presets" / "lora" / "default.toml")
    measured = measure_phases(preset, overrides, HF_HUB_OFFLINE="1")
    assert measured["status"] == "finished", measured["error"]
    got = {p["phase"]: p["peak"] for p in measured["phases"]}
    want = estimated_phases(preset, overrides)
    assert set(got) == {"load", "text cache", "transformer", "step"}, got
    assert abs(want["load"] - got["load"]) < 0.1 * got["load"], (want, got)


def test_bf16_on_the_cpu_is_timed_at_the_cpus_bf16_rate(monkeypatch):
    """A CPU where one bf16 matmul takes 20 times fp32's: a bf16 step is counted 20 times
    slower, not at fp32's rate."""
    from trainer.advisor import rules
    from trainer.system import cpu_bf16

    monkeypatch.setattr(cpu_bf16, "matmul_seconds", lambda size=1024, torch_module=None:
                        (0.01, 0.2))
    monkeypatch.setitem(rules._CPU_RATE, "rate", 1e-2)
    rules._CPU_RATE.pop("bf16", None)
    fp32, _ = rules.throughput(_cpu(16), "no")
    bf16, basis = rules.throughput(_cpu(16), "bf16")
    rules._CPU_RATE.pop("bf16", None)
    assert bf16 == pytest.approx(fp32 / 20)
    assert "bf16 20.00x slower" in basis


def test_the_step_counts_the_configured_t5_length():
    """128 T5 tokens keep fewer activations than 512, and the per-block sum at 128 equals the
    whole model simulated at 128."""
    from test_advisor_flow import _config

    from trainer.advisor import flow_memory as fm
    from trainer.advisor.flow_sizes import _TextLength, step_bytes

    config = _config("flux1", (3, 4))

    def cfg(**model):
        return from_dict({"model": {"model_version": "flux1", **model},
                          "network": {"network_dim": 4, "network_alpha": 4.0},
                          "training": {"gradient_checkpointing": True}})
    short = cfg(t5xxl_max_token_length=128)
    at_512 = step_bytes(config, cfg(), (128, 128), 1, True)
    at_128 = step_bytes(config, short, (128, 128), 1, True)
    assert at_128 < at_512
    whole = fm.meta_transformer(config).requires_grad_(False)
    fm._with_adapters(whole, short)
    direct = fm._simulate(_TextLength(whole, 128), config, (128, 128), 1, True)
    assert at_128 == pytest.approx(direct, rel=0.01)
