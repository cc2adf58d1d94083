"""NF4 and int8 base weights (model.base_precision, issue 19): bitsandbytes' 4-/8-bit Linear
layers under full-precision LoRA adapters (QLoRA) train the tiny FLUX.1 on this CPU (bitsandbytes
0.45+ quantizes on the CPU), the file has the same keys and shapes as a full-precision run's,
and where bitsandbytes cannot quantize the run is refused before the model loads, naming the
option and the backend."""

from __future__ import annotations

import math

import pytest
from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Log, Step
from trainer.models import memory
from trainer.run.loop import run


def _run(tmp_path, base: str):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    cfg = small_config(tmp_path / base, data,
                       model={"pretrained_model_name_or_path": "embedded:tiny-flux",
                              "base_precision": base},
                       training={"max_train_steps": 3, "seed": 3},
                       network={"network_dim": 4, "network_alpha": 4.0})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    losses = [e.loss for e in sink.events if isinstance(e, Step)]
    logs = [e.message for e in sink.events if isinstance(e, Log)]
    with safe_open(result.output_path, "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    return losses, logs, shapes


@pytest.mark.parametrize("base", ["nf4", "int8"])
def test_a_quantized_base_trains_and_writes_the_same_file(tmp_path, base):
    full, _, full_shapes = _run(tmp_path, "full")
    losses, logs, shapes = _run(tmp_path, base)
    assert any(f"in {base} (bitsandbytes)" in m for m in logs)
    assert all(math.isfinite(x) for x in losses) and losses != full
    assert losses[0] == pytest.approx(full[0], rel=0.1)  # same first batch, rounded weights
    assert shapes == full_shapes


def test_a_backend_where_bitsandbytes_cannot_quantize_is_refused_naming_both(monkeypatch):
    from trainer.config.files import from_dict

    cfg = from_dict({"model": {"base_precision": "nf4"}})
    with pytest.raises(memory.MemoryOptionUnavailable,
                       match=r"model.base_precision = 'nf4' on the MPS backend"):
        memory.check_memory_options(cfg, "mps", "MPS")

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this device")
    memory.load_bitsandbytes()
    monkeypatch.setattr("bitsandbytes.functional.quantize_4bit", broken)
    monkeypatch.setattr(memory, "_probe_device", lambda backend: "cpu")  # no GPU here
    with pytest.raises(memory.MemoryOptionUnavailable,
                       match=r"'nf4' on the ROCm backend: .*no kernel for this device"):
        memory.check_memory_options(cfg, "rocm", "ROCm")
