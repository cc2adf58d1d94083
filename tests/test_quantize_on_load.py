"""NF4 / int8 base weights quantized as a FLUX.1 single file loads (model.base_precision =
"nf4" / "int8"): the transformer's Linear layers become bitsandbytes' before any weight is read
and each weight is quantized as it arrives, so no full-width copy of a quantized layer outlives
its group; the layers hold the same bytes as the old path's (a full-width build quantized
afterwards), MemoryPlan.begin quantizes no more, and a LoRA run trains on them with the old
path's losses."""

from __future__ import annotations

import math
import weakref

import pytest
import torch
from test_memory_fp8 import tiny_flux_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log, Step
from trainer.families.common import mmdit_parts as flow_parts
from trainer.families.common.mmdit_single_file import load_flow_components
from trainer.models import quantize, streamed_load
from trainer.models.memory import SKIP_PATTERNS, quantize_linears
from trainer.run.loop import run

GROUP = 4096  # bytes handed over together: many groups on the tiny transformer


@pytest.fixture(scope="module")
def flux_file(tmp_path_factory):
    return tiny_flux_file(tmp_path_factory.mktemp("flux"), torch.bfloat16)


def _load(flux_file, **kwargs):
    path, configs, folder, _ = flux_file
    return load_flow_components(path, config_dir=str(configs), tokenizer=str(folder),
                                dtype=torch.bfloat16, **kwargs)["transformer"]


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_each_weight_is_quantized_as_it_arrives_and_none_is_held_full_width(
        flux_file, monkeypatch, kind):
    monkeypatch.setattr(streamed_load, "GROUP_BYTES", GROUP)
    real_quantize, real_fill, real_take = (quantize.quantize_weight, streamed_load.fill,
                                           flow_parts.Weights.take)
    alive: list[weakref.ref] = []  # the full-width weights handed to bitsandbytes
    held, wide, taken = [], [], []

    def quantize_weight(weight, *args):
        held.append(sum(r().numel() * r().element_size() for r in alive if r() is not None))
        alive.append(weakref.ref(weight))
        return real_quantize(weight, *args)

    def fill(model, tensors, names, *args, **kwargs):
        real_fill(model, tensors, names, *args, **kwargs)
        wide.append(sum(p.numel() for n, p in model.named_parameters()
                        if n in names and p.device.type != "meta" and p.is_floating_point()))

    monkeypatch.setattr(quantize, "quantize_weight", quantize_weight)
    monkeypatch.setattr(streamed_load, "fill", fill)
    monkeypatch.setattr(flow_parts.Weights, "take",
                        lambda self, prefix, *a, **k: taken.append(prefix)
                        or real_take(self, prefix, *a, **k))
    transformer = _load(flux_file, quantize_transformer=kind)
    linears = [p for n, p in transformer.named_parameters() if n.endswith(".weight")
               and type(transformer.get_submodule(n[:-7])).__name__ in ("Linear4bit",
                                                                         "Linear8bitLt")]
    full_width = sum(p.numel() for p in linears) * 2  # their bytes in bf16
    assert taken == ["vae."]  # the transformer streamed (not read whole and quantized after)
    assert len(held) == len(linears) > 10  # every weight quantized during the load
    assert len(wide) > 10 and max(wide) == 0  # after each group: none of them at full width
    # at each quantization, the earlier full-width weights still alive are one group's at most
    largest = max(p.numel() for p in linears) * 2
    assert max(held) <= max(GROUP, largest) + largest < full_width / 4
    assert all(r() is None for r in alive)


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_the_layers_equal_a_full_width_build_quantized_afterwards(flux_file, kind):
    loaded = _load(flux_file, quantize_transformer=kind)
    old = _load(flux_file)
    count = quantize_linears(old, kind, torch.bfloat16, torch.device("cpu"))
    assert len(quantize.quantized_layers(loaded)) == count > 10
    assert quantize_linears(loaded, kind, torch.bfloat16, torch.device("cpu")) == 0
    got, want = loaded.state_dict(), old.state_dict()  # quant states included
    assert got.keys() == want.keys()
    for key in got:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    skipped = [n for n, m in loaded.named_modules() if type(m) is torch.nn.Linear]
    assert skipped and all(quantize.skipped(n, SKIP_PATTERNS) for n in skipped)


def _train(tmp_path, flux_file, base: str, name: str):
    path, configs, folder, _ = flux_file
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    cfg = small_config(tmp_path / name, data,
                       model={"pretrained_model_name_or_path": str(path),
                              "config_dir": str(configs), "tokenizer": str(folder),
                              "base_precision": base},
                       training={"max_train_steps": 2, "seed": 3, "mixed_precision": "bf16"},
                       network={"network_dim": 4, "network_alpha": 4.0})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return ([e.loss for e in sink.events if isinstance(e, Step)],
            [e.message for e in sink.events if isinstance(e, Log)])


def test_a_lora_trains_on_layers_quantized_at_load_as_on_the_old_path(tmp_path, flux_file,
                                                                      monkeypatch):
    """The same run loaded the old way (the transformer built at full width, quantized by
    MemoryPlan.begin) wraps the same layers and has the same losses, bit for bit."""
    from trainer.methods.lora import LoraMethod

    wrapped = []
    real_prepare = LoraMethod.prepare

    def prepare(self, model):
        groups = real_prepare(self, model)
        wrapped.append(sorted((n, type(m.base_layer).__name__) for n, m in
                              model.unet.named_modules() if hasattr(m, "base_layer")))
        return groups

    monkeypatch.setattr(LoraMethod, "prepare", prepare)
    losses, logs = _train(tmp_path, flux_file, "nf4", "arrival")
    assert any("in nf4 (bitsandbytes) (quantized as the file loaded)" in m for m in logs)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert wrapped[0] and all(base == "Linear4bit" for _, base in wrapped[0])  # under LoRA
    monkeypatch.setattr(flow_parts, "_quantized_storage", lambda kind, dtype: None)
    old, old_logs = _train(tmp_path, flux_file, "nf4", "after")
    assert not any("quantized as the file loaded" in m for m in old_logs)
    assert wrapped[1] == wrapped[0]
    assert losses == old


def test_int8_statistics_follow_a_weight_that_moved():
    """``Module.to`` sets a moved weight's ``.data`` but leaves int8's ``CB`` (the int8 weight
    itself) pointing at the host tensor: place_state points it at the moved one, so the first
    forward does not take the host copy back (no GPU here: a fresh host tensor stands in for
    the device copy)."""
    layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    quantize_linears(layers, "int8", torch.bfloat16, torch.device("cpu"), SKIP_PATTERNS)
    moved, kept = layers
    host = kept.weight.CB
    moved.weight.data = moved.weight.data.clone()  # what Module.to does on a move
    assert moved.weight.CB.data_ptr() != moved.weight.data.data_ptr()
    quantize.place_state(layers, torch.device("cpu"), lambda p: p is moved.weight)
    assert moved.weight.CB.data_ptr() == moved.weight.data.data_ptr()
    assert kept.weight.CB is host  # a swapped block's (on the device with CUDA)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.isfinite(layers(x)).all()
