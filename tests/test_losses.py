"""The loss math and the step arithmetic, checked against their definitions and diffusers."""

import pytest
import torch
from diffusers import DDPMScheduler
from diffusers.training_utils import compute_snr

from trainer.losses import diffusion_loss, min_snr_weights, offset_noise, target_for
from trainer.plan import Meter, plan_steps


def _scheduler(prediction_type="epsilon"):
    return DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                         prediction_type=prediction_type)


def test_min_snr_weights_follow_the_paper():
    sched = _scheduler()
    t = torch.tensor([1, 100, 500, 999])
    snr = compute_snr(sched, t)
    w = min_snr_weights(snr, 5.0, "epsilon")
    expected = torch.minimum(snr, torch.full_like(snr, 5.0)) / snr
    assert torch.allclose(w, expected)
    assert w[0] < 1 and torch.isclose(w[-1], torch.tensor(1.0))  # only low-noise steps damped
    wv = min_snr_weights(snr, 5.0, "v_prediction")
    assert torch.allclose(wv, torch.minimum(snr, torch.full_like(snr, 5.0)) / (snr + 1))


def test_v_target_is_diffusers_velocity_and_epsilon_is_noise():
    sched = _scheduler("v_prediction")
    x0, noise = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    t = torch.tensor([10, 900])
    assert torch.equal(target_for("epsilon", x0, noise, t, sched), noise)
    a = sched.alphas_cumprod[t].sqrt().view(-1, 1, 1, 1)
    s = (1 - sched.alphas_cumprod[t]).sqrt().view(-1, 1, 1, 1)
    assert torch.allclose(target_for("v_prediction", x0, noise, t, sched), a * noise - s * x0,
                          atol=1e-6)
    with pytest.raises(ValueError):
        target_for("sample", x0, noise, t, sched)


def test_noise_offset_shifts_each_channel_by_a_constant():
    noise = torch.zeros(3, 4, 8, 8)
    assert offset_noise(noise, None) is noise and offset_noise(noise, 0.0) is noise
    shifted = offset_noise(noise, 0.1, torch.Generator().manual_seed(0))
    per_channel = shifted.flatten(2)
    assert torch.allclose(per_channel, per_channel[..., :1].expand_as(per_channel))
    assert shifted.abs().max() > 0


def test_loss_weights_scale_each_image():
    pred, target = torch.ones(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    assert diffusion_loss(pred, target).item() == 1.0
    assert diffusion_loss(pred, target, torch.tensor([1.0, 0.0])).item() == 0.5


def test_step_arithmetic():
    # 60 samples / batch 2 = 30 batches; accumulation 4 -> 8 optimizer steps per epoch
    plan = plan_steps(30, 4, None, 3)
    assert (plan.steps_per_epoch, plan.total_steps, plan.epochs) == (8, 24, 3)
    assert plan_steps(30, 1, None, None).total_steps == 30  # neither set: one epoch
    assert plan_steps(30, 1, 45, None).epochs == 2
    assert plan_steps(30, 1, 100, 2).total_steps == 60  # the first limit reached wins
    with pytest.raises(ValueError):
        plan_steps(0, 1, None, 1)


def test_meter_reports_rate_and_eta():
    m = Meter(window=3)
    for i, loss in enumerate([4.0, 2.0, 3.0, 1.0]):
        m.update(loss, now=float(i))
    assert m.loss_avg == 2.0 and m.it_per_s == 1.0 and m.eta(10) == 10.0


def test_min_snr_weight_at_zero_snr_is_one_not_nan():
    snr = torch.tensor([0.0, 2.0, 10.0])
    assert torch.equal(min_snr_weights(snr, 5.0, "epsilon"), torch.tensor([1.0, 1.0, 0.5]))
    assert torch.allclose(min_snr_weights(snr, 5.0, "v_prediction"),
                          torch.tensor([0.0, 2.0 / 3.0, 5.0 / 11.0]))
