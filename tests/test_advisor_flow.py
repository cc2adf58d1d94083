"""The advisor for FLUX.1 and SD 3.5 (issue 19): the step's memory from small models of the same
width, extrapolated per block, equals the simulation of the whole model; the weights by option
match the real parameter counts; the cheapest combination that fits is recommended, and asked
again it answers at once."""

from __future__ import annotations

import time

import pytest
from train_helpers import one_image_dataset

from trainer.advisor import flow_memory as fm
from trainer.advisor.advice import GIB
from trainer.advisor.estimate import advise
from trainer.advisor.flow_advice import FlowOption, cheapest_fit, flow_memory
from trainer.config.files import from_dict
from trainer.families.common import tiny_mmdit as tiny_flow
from trainer.system.device import DeviceInfo

CARD_16GB = DeviceInfo(backend="cuda", name="NVIDIA GeForce RTX 4080", torch_device="cuda:0",
                       memory_bytes=16 * GIB, bf16_ok=True, fp16_ok=True,
                       torch_version="2.13.0")


def _cfg(**network):
    return from_dict({"network": {"network_dim": 4, "network_alpha": 4.0, **network},
                      "training": {"gradient_checkpointing": True}})


def _config(family: str, blocks: tuple[int, int]) -> dict:
    build = tiny_flow.build_flux_components if family == "flux1" \
        else tiny_flow.build_sd3_components
    transformer = build()["transformer"]
    config = dict(transformer.config, num_layers=blocks[0],
                  _class_name=type(transformer).__name__)
    if family == "flux1":
        config["num_single_layers"] = blocks[1]
    return config


@pytest.mark.parametrize("family,blocks", [("flux1", (3, 4)), ("sd3", (4, 0))])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_per_block_model_equals_the_whole_simulation(family, blocks, checkpointing):
    config, cfg = _config(family, blocks), _cfg()
    cheap = fm.simulate_flow_step(config, cfg, (128, 128), 2, checkpointing)
    whole = fm.simulate_flow_step(config, cfg, (128, 128), 2, checkpointing, full=True)
    assert cheap == pytest.approx(whole, rel=0.01)


@pytest.mark.parametrize("family,blocks", [("flux1", (3, 4)), ("sd3", (4, 0))])
def test_weights_by_option_count_the_real_model(family, blocks):
    config, cfg = _config(family, blocks), _cfg()
    w = fm.flow_weights(config, cfg)
    model = fm.meta_transformer(config)
    assert w.total == sum(p.numel() for p in model.parameters())
    adapted = fm.meta_transformer(config)
    fm._with_adapters(adapted, cfg)
    assert w.lora == sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n)
    full, fp8 = fm.weight_bytes(w, "full", None), fm.weight_bytes(w, "fp8", None)
    assert full == 2 * w.total
    assert fp8 == full - sum(w.fp8_units) - w.fp8_other
    assert fm.weight_bytes(w, "nf4", None) < fp8
    swapped = fm.weight_bytes(w, "fp8", 3)  # three blocks off, two of them in flight
    assert swapped < fp8


def test_flux_dev_on_16_gb_gets_the_cheapest_combination_that_fits():
    import json

    from trainer.config.paths import PROJECT_ROOT

    config = json.loads((PROJECT_ROOT / "trainer/assets/families/flux1-dev/transformer/"
                         "config.json").read_text())
    cfg = from_dict({"network": {"network_dim": 16, "network_alpha": 1.0},
                     "optimizer": {"optimizer_type": "AdamW8bit"},
                     "training": {"gradient_checkpointing": True}})
    option, memory = cheapest_fit(config, cfg, (1024, 1024), 16 * GIB, 1)
    assert option.base == "fp8" and option.swap and option.batch == 1
    assert memory.peak <= 16 * GIB * 0.95
    less = FlowOption("fp8", option.swap - 4 or None, 1)
    assert flow_memory(config, cfg, (1024, 1024), less, None).peak > 16 * GIB * 0.95
    start = time.perf_counter()
    for px in (512, 768, 1024):
        cheapest_fit(config, cfg, (px, px), 12 * GIB, 1)
    cheapest_fit(config, cfg, (1024, 1024), 16 * GIB, 1)
    assert time.perf_counter() - start < 60  # three new resolutions' simulations
    start = time.perf_counter()
    cheapest_fit(config, cfg, (1024, 1024), 16 * GIB, 1)
    assert time.perf_counter() - start < 2  # asked again: arithmetic on cached simulations


def test_advise_covers_the_tiny_flux_with_its_memory_lines(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    cfg = from_dict({"model": {"pretrained_model_name_or_path": "embedded:tiny-flux",
                               "base_precision": "fp8"},
                     "dataset": {"train_data_dir": str(data), "resolution": 64,
                                 "min_bucket_reso": 64, "max_bucket_reso": 128,
                                 "bucket_reso_steps": 64},
                     "training": {"gradient_checkpointing": True, "blocks_to_swap": 1}})
    advice = advise(cfg, CARD_16GB)
    assert not advice.problems, advice.problems
    lines = dict(advice.memory.lines)
    assert any("fp8, 1 blocks swapped" in k for k in lines)
    assert advice.memory.fits and advice.timing.seconds_per_step > 0


def test_a_second_process_answers_from_the_disk_cache(tmp_path, monkeypatch):
    """The simulations are kept on disk: with the in-memory answers gone (a new process) the
    same estimate comes back without simulating, at once."""
    from trainer.advisor import footprint, model_configs, shipped
    from trainer.advisor.disk_cache import cache_file

    monkeypatch.setitem(shipped._LOADED, "index", {})  # simulated, not shipped

    data = one_image_dataset(tmp_path / "data")
    cfg = from_dict({"mode": "dreambooth", "dataset": {
        "train_data_dir": str(data), "resolution": 64, "min_bucket_reso": 64,
        "max_bucket_reso": 128, "bucket_reso_steps": 64}})
    first = advise(cfg, CARD_16GB)
    assert first.memory is not None and cache_file().is_file()
    monkeypatch.setattr(model_configs, "_CACHE", {})

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated again")
    monkeypatch.setattr(footprint, "_one_step", no_simulation)
    start = time.perf_counter()
    again = advise(cfg, CARD_16GB)
    assert time.perf_counter() - start < 2
    assert again.memory == first.memory and again.timing == first.timing


def test_advise_reads_a_bfl_transformer_file_as_train_does(tmp_path):
    """model_version = "auto" with FLUX.1's transformer alone in BFL's layout (and its ae,
    clip_l, t5xxl files): the advisor reads the family and the shapes from the header, as train
    does (issue 29: it used to refuse the file as an SD checkpoint without a UNet)."""
    from test_flow_train import single_file_model

    from trainer.advisor.flow_advice import flow_transformer_config

    data = one_image_dataset(tmp_path / "data")
    model = {**single_file_model(tmp_path, "flux1"), "model_version": "auto",
             "base_precision": "fp8"}
    cfg = from_dict({"model": model,
                     "dataset": {"train_data_dir": str(data), "resolution": 64,
                                 "min_bucket_reso": 64, "max_bucket_reso": 128,
                                 "bucket_reso_steps": 64},
                     "training": {"gradient_checkpointing": True}})
    advice = advise(cfg, CARD_16GB)
    assert not advice.problems, advice.problems
    assert any(k.startswith("transformer weights (fp8") for k in dict(advice.memory.lines))
    tiny = tiny_flow.build_flux_components()["transformer"].config
    config = flow_transformer_config(cfg.model)
    for key in ("num_layers", "num_single_layers", "num_attention_heads", "attention_head_dim",
                "joint_attention_dim", "in_channels"):
        assert config[key] == tiny[key], key


def test_the_family_of_a_file_is_read_without_torch(tmp_path):
    """The detection that train, advise and the GUI share reads the header alone and imports
    no torch (the GUI and the doctor answer before torch is loaded)."""
    import subprocess
    import sys

    from test_flow_train import single_file_model

    path = single_file_model(tmp_path, "flux1")["pretrained_model_name_or_path"]
    code = ("import sys\n"
            "from trainer.families import detect_path, family_or_none\n"
            f"found = detect_path({path!r})\n"
            f"assert found.is_flow and family_or_none({str(tmp_path / 'ae.st')!r}) is None\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print(found.flow.family, found.family)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["flux1-dev", "flux1"]


@pytest.mark.parametrize("family,blocks", [("flux1", (3, 4)), ("sd3", (4, 0))])
def test_the_step_time_counts_the_configured_t5_length(family, blocks):
    """The text tokens of a step are the T5 length the run pads to (model.
    t5xxl_max_token_length), not the family's default (issue 29: 128 counted as 512)."""
    from trainer.advisor.flow_advice import flow_timing

    config = _config(family, blocks)
    option = FlowOption("fp8", None, 1, True)
    image = (512 // 16) ** 2
    clip = 0 if family == "flux1" else 77
    flop = {}
    for length in (None, 128):
        cfg = from_dict({"model": {"t5xxl_max_token_length": length, "model_version": family},
                         "network": {"network_dim": 4}})
        flop[length] = flow_timing(config, cfg, CARD_16GB, "bf16", (512, 512),
                                   option).tflop_per_step
    default = 512 if family == "flux1" else 256
    assert flop[128] / flop[None] == pytest.approx((image + 128 + clip) / (image + default + clip))


def test_on_the_cpu_the_step_is_held_against_the_ram():
    """On the CPU a FLUX.1 step lives in host memory: the advisor compares it with the RAM and
    recommends what fits (it used to answer "fits" for any size: FLUX.1-dev in bf16 on a
    24 GiB machine), and counts the Python runtime, not a CUDA context."""
    import json

    from trainer.advisor.advice import Advice, Steps
    from trainer.advisor.flow_advice import flow_advise
    from trainer.config.paths import PROJECT_ROOT

    config = json.loads((PROJECT_ROOT / "trainer/assets/families/flux1-dev/transformer/"
                         "config.json").read_text())
    cfg = from_dict({"model": {"base_precision": "full"}, "network": {"network_dim": 4},
                     "training": {"gradient_checkpointing": True}})
    ram = DeviceInfo(backend="cpu", name="a CPU", torch_device="cpu", memory_bytes=24 * GIB,
                     bf16_ok=True, fp16_ok=False, torch_version="2.13.0")
    advice = Advice(device="a CPU", precision="fp32",
                    steps=Steps(images=1, steps_per_epoch=1, total_steps=1))
    flow_advise(advice, cfg, ram, config)
    assert advice.memory.lines[0][0] == "runtime: Python and the libraries"
    assert not advice.memory.fits  # 22 GiB of bf16 weights alone
    first = advice.recommendations[0]
    assert first.title.startswith("24 GB: fp8 base")
    assert first.changes.get("model.base_precision") == "fp8"
