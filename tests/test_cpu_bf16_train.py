"""bf16 base weights on the CPU train as well as fp32 (issue 20): 200 steps on the tiny model
reach a loss within 5% of fp32's, and the LoRA file has the same keys, shapes and dtypes."""

from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Step
from trainer.run.loop import run

STEPS = 200
TOLERANCE = 0.05  # relative, on the mean loss of the last 50 steps (measured: 0.2%)


def _train(tmp_path, precision):
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, training={"mixed_precision": precision,
                                                 "max_train_steps": STEPS, "seed": 7},
                       optimizer={"learning_rate": 1e-3})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    losses = [e.loss for e in sink.events if isinstance(e, Step)]
    assert len(losses) == STEPS
    with safe_open(result.output_path, "pt") as f:
        layout = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                  for k in f.keys()}
        metadata = f.metadata()
    return sum(losses[-50:]) / 50, sum(losses[:10]) / 10, layout, metadata


def test_200_steps_with_bf16_base_weights_reach_fp32s_loss(tmp_path):
    fp32, fp32_start, fp32_layout, fp32_meta = _train(tmp_path / "fp32", "no")
    bf16, _, bf16_layout, bf16_meta = _train(tmp_path / "bf16", "bf16")
    assert fp32 < fp32_start  # it learned
    assert abs(bf16 - fp32) <= TOLERANCE * fp32, (bf16, fp32)
    assert bf16_layout == fp32_layout  # same keys, shapes and (save_precision) dtypes
    assert bf16_meta["ss_mixed_precision"] == "bf16"
    assert set(bf16_meta) == set(fp32_meta)
