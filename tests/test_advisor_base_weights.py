"""The advisor and the memory options of SD 1.x / 2.x / SDXL (issue 19): the frozen UNet's bytes
with fp8, NF4 and int8 base weights equal what the run's own storage (trainer/models/memory.py)
holds; the compute copies fp8 needs without checkpointing; the latent cache's batches as the
trainer sizes them; fp8 among the changes when a LoRA does not fit; the CPU's precision advice
by its bf16 units."""

from __future__ import annotations

import json

import pytest
import torch
from test_advisor import GB, gpu, titles
from train_helpers import preset_config

from trainer.advisor import estimate as advisor
from trainer.advisor.base_weights import compute_copies, device_bytes, unet_weights
from trainer.advisor.model_configs import built_configs
from trainer.advisor.rules import device_rules
from trainer.config.paths import PROJECT_ROOT
from trainer.models.block_swap import swap_units
from trainer.models.memory import quantize_linears, store_fp8
from trainer.system.device import DeviceInfo

SDXL_CONFIGS = PROJECT_ROOT / "trainer" / "assets" / "families" / "sdxl"  # configs, no weights
GIB = 2**30


def _tiny_unet() -> tuple[object, torch.nn.Module]:
    from diffusers import UNet2DConditionModel

    configs = built_configs("embedded:tiny-sdxl")
    torch.manual_seed(0)
    unet = UNet2DConditionModel.from_config(configs.unet).to(torch.bfloat16)
    return configs, unet.requires_grad_(False)


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_the_counts_are_the_unets_and_its_swap_units():
    configs, unet = _tiny_unet()
    w = unet_weights(configs)
    assert w.total == sum(p.numel() for p in unet.parameters())
    units = swap_units(unet)
    assert w.units == tuple(sum(p.numel() for p in u.parameters()) for u in units)
    assert device_bytes(w, "full", None, 2) == _param_bytes(unet)
    # four blocks swapped: theirs leave the device, the two largest of them in flight
    away = sorted((_param_bytes(u) for u in units[-4:]), reverse=True)
    assert device_bytes(w, "full", 4, 2) == _param_bytes(unet) - sum(away[2:])


def test_fp8_bytes_are_what_the_runs_fp8_storage_holds():
    configs, unet = _tiny_unet()
    store_fp8(unet, torch.bfloat16)
    assert device_bytes(unet_weights(configs), "fp8", None, 2) == _param_bytes(unet)


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_quantized_bytes_are_within_a_few_percent_of_bitsandbytes(kind):
    configs, unet = _tiny_unet()
    quantize_linears(unet, kind, torch.bfloat16, torch.device("cpu"))
    held = _param_bytes(unet)
    for module in unet.modules():  # the quantization's scales beside the codes
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None:
            held += state.absmax.numel() * state.absmax.element_size()
        scales = getattr(getattr(module, "weight", None), "SCB", None)
        if scales is not None:
            held += scales.numel() * scales.element_size()
    estimate = device_bytes(unet_weights(configs), kind, None, 2)
    assert held * 0.97 <= estimate <= held * 1.05, (estimate, held)


def test_fp8_without_checkpointing_keeps_every_compute_copy():
    w = unet_weights(built_configs("embedded:tiny-sdxl"))
    one_block = compute_copies(w, "fp8", 2, checkpointing=True)
    every = compute_copies(w, "fp8", 2, checkpointing=False)
    assert one_block == 2 * max(w.fp8_units) and every == 2 * (sum(w.fp8_units) + w.fp8_other)
    assert compute_copies(w, "nf4", 2, checkpointing=False) == 0


def _sdxl_lora(tmp_path, base: str = "full", **training):
    return preset_config(
        tmp_path, model={"pretrained_model_name_or_path": str(SDXL_CONFIGS),
                         "base_precision": base},
        dataset={"resolution": 1024, "min_bucket_reso": 512, "max_bucket_reso": 1024,
                 "bucket_reso_steps": 64},
        training={"mixed_precision": "bf16", "gradient_checkpointing": True,
                  "train_batch_size": 1, **training})


def test_an_sdxl_lora_at_1024_px_fits_8_gb_and_its_cache_batches_follow_the_memory(tmp_path):
    """The latent cache encodes before the UNet is on the device (trainer/run/session.py), in
    batches of half the free memory (trainer/data/cache_batches.py); the text encoders leave the
    device once their outputs are cached. sd-scripts' SDXL docs: a LoRA trains on 8 GB. Before,
    a fixed batch of 4 beside the whole model said 17 GiB on 12 GB and that nothing would fit."""
    cfg = _sdxl_lora(tmp_path)
    small = advisor.advise(cfg, gpu("NVIDIA GeForce RTX 3070", 8 * GIB))
    assert small.memory.fits and small.memory.phase == "training step", small.memory.lines
    assert not any(w.startswith("frozen text encoders") for w, _ in small.memory.lines)
    configs = read_sdxl()
    assert advisor.cache_rows(configs, (1024, 1024), 8 * GIB, 2 * GIB) == 1
    assert advisor.cache_rows(configs, (1024, 1024), 80 * GIB, 2 * GIB) > 4
    assert advisor.cache_rows(configs, (512, 512), 8 * GIB, 2 * GIB) > 1


def read_sdxl():
    from trainer.advisor.footprint import read_configs
    from trainer.config.sections.model import ModelSection

    return read_configs(ModelSection(pretrained_model_name_or_path=str(SDXL_CONFIGS)))


def test_fp8_base_is_what_to_change_first_when_an_sdxl_lora_misses_by_a_little(tmp_path):
    cfg = _sdxl_lora(tmp_path)
    card = gpu("NVIDIA GeForce RTX 2060", 6 * GIB)
    advice = advisor.advise(cfg, card)
    assert not advice.memory.fits
    first = advice.recommendations[0]
    assert first.changes == {"model.base_precision": "fp8"}, advice.recommendations
    fp8 = advisor.advise(_sdxl_lora(tmp_path, "fp8"), card)
    # 2.6 GB less UNet, 0.7 GB of bf16 copies of one block for the backward pass
    assert fp8.memory.fits and fp8.memory.peak < advice.memory.peak - 1.5 * GB
    lines = dict(fp8.memory.lines)
    assert any(w.startswith("frozen UNet") and "fp8 base" in w for w in lines)
    # the CPU casts fp8 slowly: never proposed there
    cpu = DeviceInfo(backend="cpu", name="A CPU", torch_device="cpu", memory_bytes=4 * GIB,
                     bf16_ok=True, fp16_ok=False, torch_version="2.13.0")
    assert all("base_precision" not in "".join(r.changes)
               for r in advisor.advise(cfg, cpu).recommendations)


def test_the_cpu_precision_advice_follows_its_bf16_units(tmp_path, monkeypatch):
    cpu = DeviceInfo(backend="cpu", name="A CPU", torch_device="cpu", memory_bytes=64 * GB,
                     bf16_ok=True, fp16_ok=False, torch_version="2.13.0")
    bf16 = preset_config(tmp_path, training={"mixed_precision": "bf16"})
    monkeypatch.setenv("KOHYA_STUDIO_CPU_BF16_UNITS", "none")
    assert titles(device_rules(bf16, cpu, "bf16"))["Train in fp32 on the CPU"] == {
        "training.mixed_precision": "no"}
    monkeypatch.setenv("KOHYA_STUDIO_CPU_BF16_UNITS", "avx512_bf16")
    got = {r.title: r for r in device_rules(bf16, cpu, "bf16")}
    assert "Train in fp32 on the CPU" not in got
    assert got["Let auto choose bf16 or fp32"].changes == {"training.mixed_precision": "auto"}
    assert "avx512_bf16" in got["Let auto choose bf16 or fp32"].why
    auto = preset_config(tmp_path, training={"mixed_precision": "auto"})
    assert {r.title: r for r in device_rules(auto, cpu, "no")}[
        "Let auto choose bf16 or fp32"].done


def test_the_shipped_counts_are_current():
    """What ships for the families' UNets equals a count now (else: python -m
    trainer.advisor.make_shipped --base-weights)."""
    from dataclasses import asdict

    from trainer.advisor import shipped
    from trainer.advisor.base_weights import count_unet, weights_key
    from trainer.advisor.make_shipped import unet_configs

    for model in shipped.UNET_MODELS:
        configs = unet_configs(model)
        got = shipped.lookup(configs.key, weights_key(configs))
        assert got is not shipped.MISSING, model
        want = json.loads(json.dumps(asdict(count_unet(configs))))
        assert got == want, model
