"""The loss math and the step arithmetic, checked against their definitions and diffusers."""

import math

import pytest
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from diffusers.training_utils import compute_snr

from trainer.config.files import from_dict
from trainer.config.plan import plan_steps
from trainer.objectives.losses import (
    debiased_weights,
    diffusion_loss,
    elementwise_loss,
    huber_threshold,
    min_snr_weights,
    offset_noise,
    pyramid_noise,
    sample_timesteps,
    target_for,
    v_pred_like_noise_pred_weights,
)
from trainer.run.meter import Meter


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


def test_noise_offset_random_strength_and_adaptive_scale_follow_sd_scripts():
    noise, latents = torch.zeros(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    out = offset_noise(noise, 0.2, torch.Generator().manual_seed(5), latents=latents,
                       adaptive_scale=0.5, random_strength=True)
    gen = torch.Generator().manual_seed(5)  # the same draws, in sd-scripts' order
    strength = torch.rand(1, generator=gen).item() * 0.2
    strength = strength + 0.5 * latents.mean(dim=(2, 3), keepdim=True).abs()
    expected = strength * torch.randn(2, 3, 1, 1, generator=gen)
    assert torch.allclose(out, expected.expand_as(out), atol=1e-7)
    # a negative adaptive scale never makes the offset negative (clamped at 0)
    flat = offset_noise(noise, 0.01, torch.Generator().manual_seed(5), latents=latents + 10,
                        adaptive_scale=-1.0)
    assert torch.equal(flat, noise)


def _pyramid_by_hand(noise, iterations, discount, gen):
    """sd-scripts' pyramid_noise_like written out level by level with nn.Upsample."""
    b, c, h, w = noise.shape
    total = noise.clone()
    up = torch.nn.Upsample(size=(h, w), mode="bilinear")
    for i in range(iterations):
        r = 2 + 2 * torch.rand((), generator=gen).item()
        hn, wn = max(1, int(h / (r ** i))), max(1, int(w / (r ** i)))
        total += up(torch.randn(b, c, hn, wn, generator=gen)) * discount ** i
        if hn == 1 or wn == 1:
            break
    return total / total.std()


def test_multires_noise_matches_its_definition_and_has_unit_std():
    base = torch.randn(2, 4, 16, 24, generator=torch.Generator().manual_seed(1))
    out = pyramid_noise(base, 6, 0.3, torch.Generator().manual_seed(2))
    expected = _pyramid_by_hand(base, 6, 0.3, torch.Generator().manual_seed(2))
    assert out.shape == base.shape and torch.allclose(out, expected, atol=1e-6)
    assert math.isclose(out.std().item(), 1.0, rel_tol=1e-5)
    assert not torch.equal(out, base / base.std())  # the low-frequency levels were added
    # the levels stop at 1 pixel: 64 more iterations draw nothing more than enough to get there
    deep = pyramid_noise(base, 64, 0.3, torch.Generator().manual_seed(2))
    assert torch.equal(deep, pyramid_noise(base, 10, 0.3, torch.Generator().manual_seed(2)))


def test_timesteps_stay_in_min_max_and_default_to_the_old_draw():
    torch.manual_seed(0)
    old = torch.randint(0, 1000, (64,)).long()
    torch.manual_seed(0)
    assert torch.equal(sample_timesteps(64, 1000, None, None, torch.device("cpu")), old)
    torch.manual_seed(0)
    t = sample_timesteps(4000, 1000, 200, 205, torch.device("cpu"))
    assert set(t.tolist()) == {200, 201, 202, 203, 204}  # max is exclusive
    for low, high in ((5, 5), (0, 1001)):
        with pytest.raises(ValueError, match="training.min_timestep"):
            sample_timesteps(1, 1000, low, high, torch.device("cpu"))


def test_debiased_and_v_scaling_weights():
    snr = torch.tensor([0.25, 4.0, 1e6])
    assert torch.allclose(debiased_weights(snr, "epsilon"),
                          torch.tensor([2.0, 0.5, 1 / math.sqrt(1000)]))  # capped at 1000
    assert torch.allclose(debiased_weights(snr, "v_prediction"),
                          torch.tensor([0.8, 0.2, 1 / 1001]))
    assert torch.allclose(v_pred_like_noise_pred_weights(snr),
                          torch.tensor([0.2, 0.8, 1000 / 1001]))


def test_huber_schedules_at_known_timesteps():
    sched = _scheduler()
    t = torch.tensor([0, 250, 999])
    const = huber_threshold("constant", 0.1, 2.0, t, 1000)
    assert torch.allclose(const, torch.full((3,), 0.2))
    expo = huber_threshold("exponential", 0.1, 2.0, t, 1000)
    # exp(-t * (-ln c) / T) * scale: 1 * scale at t = 0, c * scale at t = T
    assert torch.allclose(expo, torch.tensor([2.0, 2 * 0.1 ** 0.25, 2 * 0.1 ** 0.999]))
    snr = huber_threshold("snr", 0.1, 2.0, t, 1000, compute_snr(sched, t))
    ac = sched.alphas_cumprod[t]
    sigma = ((1 - ac) / ac).sqrt()
    assert torch.allclose(snr, 0.9 / (1 + sigma) ** 2 + 0.1, atol=1e-6)
    assert snr[0] > 0.9 and snr[0] > snr[1] > snr[2] > 0.1
    with pytest.raises(ValueError):
        huber_threshold("linear", 0.1, 1.0, t, 1000)


def test_loss_types_by_hand():
    pred, target = torch.tensor([[3.0, -1.0]]), torch.zeros(1, 2)
    c = torch.tensor([4.0])
    assert torch.equal(elementwise_loss(pred, target, "l2"), torch.tensor([[9.0, 1.0]]))
    assert torch.equal(elementwise_loss(pred, target, "l1"), torch.tensor([[3.0, 1.0]]))
    # sqrt(3^2 + 4^2) = 5: smooth_l1 = 2 (5 - 4) = 2, huber = c * that = 8
    smooth = elementwise_loss(pred, target, "smooth_l1", c)
    assert torch.allclose(smooth, torch.tensor([[2.0, 2 * (math.sqrt(17) - 4)]]))
    assert torch.allclose(elementwise_loss(pred, target, "huber", c), 4 * smooth)
    with pytest.raises(ValueError):
        elementwise_loss(pred, target, "huber")
    assert diffusion_loss(pred, target).item() == F.mse_loss(pred, target).item()


def test_mask_weights_each_pixel():
    pred, target = torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)
    mask = torch.tensor([[[[0.0, 1.0], [0.5, 1.0]]]])
    assert diffusion_loss(pred, target, mask=mask).item() == 2.5 / 4


@pytest.mark.parametrize("training, named", [
    ({"min_timestep": 500, "max_timestep": 500}, "training.min_timestep"),
    ({"adaptive_noise_scale": 0.1}, "training.adaptive_noise_scale"),
    ({"noise_offset_random_strength": True}, "training.noise_offset_random_strength"),
    ({"masked_loss": True}, "training.masked_loss"),
    ({"debiased_estimation_loss": True, "zero_terminal_snr": True},
     "training.debiased_estimation_loss"),
    ({"loss_type": "l3"}, "training.loss_type"),
    ({"max_timestep": 1001}, "training.max_timestep"),
])
def test_loss_options_that_cannot_work_are_refused_by_name(training, named):
    with pytest.raises(ValueError, match=named):
        from_dict({"training": training})


def test_scale_v_pred_is_refused_for_epsilon_and_masks_need_masked_loss():
    with pytest.raises(ValueError, match="scale_v_pred_loss_like_noise_pred"):
        from_dict({"training": {"scale_v_pred_loss_like_noise_pred": True},
                   "model": {"prediction_type": "epsilon"}})
    with pytest.raises(ValueError, match="dataset.alpha_mask"):
        from_dict({"dataset": {"alpha_mask": True}})
    cfg = from_dict({"training": {"masked_loss": True}, "dataset": {"alpha_mask": True}})
    assert cfg.training.masked_loss and cfg.training.loss_type == "l2"
