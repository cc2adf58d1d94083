"""training.ema_decay: the EMA of the trained weights, derived by hand (diffusers' EMAModel with
the warm-up 1 - n^(-2/3), or a constant decay), saved and sampled from when
saving.use_ema_weights says so; the exact resume is a case of tests/test_resume.py."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.config import TrainConfig
from trainer.run.ema import Ema, NoEma, make_ema
from trainer.run.loop import run


def _trajectory(warmup: bool, decay: float):
    p = torch.nn.Parameter(torch.zeros(3))
    ema = Ema([p], decay, warmup, True)
    for k in range(1, 6):
        with torch.no_grad():
            p.copy_(torch.full((3,), float(k * k)))
        ema.update()
    return p, ema


@pytest.mark.parametrize("warmup", [True, False])
def test_average_by_hand(warmup):
    decay = 0.9
    p, ema = _trajectory(warmup, decay)
    shadow = 0.0  # the initial weights
    for n in range(1, 6):
        if warmup:  # the first update takes the weights as they are
            d = 0.0 if n == 1 else min(decay, 1 - n ** (-2 / 3))
        else:
            d = decay
        shadow = d * shadow + (1 - d) * n * n
    with ema.applied():
        assert torch.allclose(p, torch.full((3,), shadow), atol=1e-5)
    assert torch.equal(p, torch.full((3,), 25.0))  # the trained weights are back


def test_off_unless_set_and_outputs_may_keep_the_trained_weights():
    assert isinstance(make_ema(TrainConfig(), []), NoEma)
    cfg = TrainConfig.model_validate({"training": {"ema_decay": 0.5},
                                      "saving": {"use_ema_weights": False}})
    p = torch.nn.Parameter(torch.zeros(2))
    ema = make_ema(cfg, [p])
    with torch.no_grad():
        p.add_(1.0)
    ema.update()
    with ema.applied():
        assert torch.equal(p, torch.ones(2))
    with pytest.raises(ValueError, match="ema_decay"):
        TrainConfig.model_validate({"training": {"ema_decay": 1.0}})


def test_two_steps_save_the_average_of_the_step_weights(tmp_path):
    """With the warm-up the first update copies step 1's weights and the second has decay
    1 - 2^(-2/3): the saved file is that mix of the plain run's step-1 and step-2 files."""
    data = one_image_dataset(tmp_path / "data")

    def train(out: str, use_ema: bool):
        cfg = small_config(tmp_path / out, data, training={"max_train_steps": 2,
                                                           "ema_decay": 0.99},
                           saving={"use_ema_weights": use_ema, "save_every_n_steps": 1,
                                   "output_name": "run"},
                           optimizer={"learning_rate": 1e-2})
        result = run(cfg)
        assert result.status == "finished", result.error
        return result.output_path

    plain = train("plain", False)
    step1 = load_file(plain.replace("run.safetensors", "run-step00000001.safetensors"))
    step2 = load_file(plain)
    averaged = load_file(train("ema", True))
    d = 1 - 2 ** (-2 / 3)
    moved = 0
    for key, tensor in averaged.items():
        want = d * step1[key] + (1 - d) * step2[key]
        assert torch.allclose(tensor, want, atol=1e-6), key
        moved += not torch.equal(step1[key], step2[key])
    assert moved  # the weights did change between the steps
