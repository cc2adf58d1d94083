"""Flow matching: every function against numbers worked out here by hand, and against diffusers'
FlowMatchEulerDiscreteScheduler where it computes the same thing."""

import math

import pytest
import torch

from trainer.objectives.flow import (
    DEFAULTS,
    SD_SCRIPTS_DEFAULTS,
    apply_prediction_type,
    flux_mu,
    image_seq_len,
    loss_weights,
    noisy_latents,
    prediction_loss_weights,
    sample_sigmas,
    shift_sigmas,
    time_shift,
    timesteps_of,
    velocity_target,
)


def FlowMatchEulerDiscreteScheduler(**kw):  # noqa: N802 - stands for the class
    """diffusers' scheduler, imported after trainer (which hides bitsandbytes from diffusers:
    imported the other way round, diffusers' later model imports fail)."""
    from diffusers import FlowMatchEulerDiscreteScheduler as Scheduler

    return Scheduler(**kw)


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_noisy_latents_lie_on_the_line_from_latents_to_noise():
    latents, noise = torch.full((3, 2, 4, 4), 2.0), torch.full((3, 2, 4, 4), -1.0)
    noisy = noisy_latents(latents, noise, torch.tensor([0.0, 0.25, 1.0]))
    # 0.75 * 2 + 0.25 * -1 = 1.25; sigma 0 is the latents, sigma 1 the noise
    assert noisy[:, 0, 0, 0].tolist() == [2.0, 1.25, -1.0]
    assert torch.all(velocity_target(latents, noise) == -3.0)
    assert timesteps_of(torch.tensor([0.25])).item() == 250.0


def test_noisy_latents_match_the_schedulers_forward_process():
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    latents, noise = torch.randn(3, 16, 8, 8, generator=seeded()), torch.randn(
        3, 16, 8, 8, generator=seeded(1))
    index = torch.tensor([0, 500, 999])
    expected = scheduler.scale_noise(latents, scheduler.timesteps[index], noise)
    assert torch.allclose(noisy_latents(latents, noise, scheduler.sigmas[index]), expected,
                          atol=1e-6)


def test_shift_by_hand_and_as_the_scheduler_shifts():
    # 3 * 0.25 / (1 + 2 * 0.25) = 0.5; 3 * 0.5 / (1 + 2 * 0.5) = 0.75; the ends stay put
    shifted = shift_sigmas(torch.tensor([0.0, 0.25, 0.5, 1.0]), 3.0)
    assert torch.allclose(shifted, torch.tensor([0.0, 0.5, 0.75, 1.0]))
    plain = FlowMatchEulerDiscreteScheduler(shift=1.0).sigmas
    assert torch.allclose(shift_sigmas(plain, 3.0),
                          FlowMatchEulerDiscreteScheduler(shift=3.0).sigmas, atol=1e-6)


def test_time_shift_by_hand_and_as_the_scheduler_shifts():
    # e^mu / (e^mu + 1/s - 1): mu = ln 3 at s = 0.5 is 3 / (3 + 1); at s = 0.25, 3 / (3 + 3)
    assert torch.allclose(time_shift(torch.tensor([0.5, 0.25]), math.log(3.0)),
                          torch.tensor([0.75, 0.5]))
    # at s = 0.5 it is sigmoid(mu)
    assert time_shift(torch.tensor([0.5]), 1.15).item() == pytest.approx(sigmoid(1.15))
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    s = torch.linspace(0.01, 0.99, 50)
    assert torch.allclose(time_shift(s, 0.8), scheduler.time_shift(0.8, 1.0, s))


def test_flux_mu_grows_with_the_image():
    assert image_seq_len(64, 64) == 1024  # 512 px: 64x64 latents, 32x32 2x2 patches
    assert image_seq_len(128, 128) == 4096 and image_seq_len(33, 17) == 16 * 8
    assert flux_mu(256) == pytest.approx(0.5)
    assert flux_mu(4096) == pytest.approx(1.15)
    assert flux_mu(1024) == pytest.approx(0.5 + 0.65 * (1024 - 256) / (4096 - 256))  # 0.63


def normals(n, seed=0):
    return torch.randn(n, generator=seeded(seed)).tolist()


def test_uniform_sigmoid_shift_and_flux_shift_by_hand():
    n = normals(6)
    got = sample_sigmas("sigmoid", 6, sigmoid_scale=2.0, generator=seeded())
    assert got.tolist() == pytest.approx([sigmoid(2.0 * x) for x in n])
    got = sample_sigmas("shift", 6, discrete_flow_shift=3.1582, generator=seeded())
    assert got.tolist() == pytest.approx(
        [3.1582 * sigmoid(x) / (1 + 2.1582 * sigmoid(x)) for x in n])
    mu = 0.5 + 0.65 * (1024 - 256) / 3840  # 64x64 latents: 1024 tokens
    got = sample_sigmas("flux_shift", 6, latent_size=(64, 64), generator=seeded())
    assert got.tolist() == pytest.approx(
        [math.exp(mu) / (math.exp(mu) + 1 / sigmoid(x) - 1) for x in n])
    u = torch.rand(6, generator=seeded()).tolist()
    assert sample_sigmas("uniform", 6, generator=seeded()).tolist() == pytest.approx(u)


def schedule_sigma(u, shift):
    """The sigma at index int(u * 1000) of the 1000-step schedule (1000 - i) / 1000, shifted."""
    s = (1000 - int(u * 1000)) / 1000
    return shift * s / (1 + (shift - 1) * s)


def test_sigma_sampling_by_hand_for_each_density():
    u = [sigmoid(x) for x in torch.normal(0.5, 2.0, (8,), generator=seeded()).tolist()]
    got = sample_sigmas("sigma", 8, weighting_scheme="logit_normal", logit_mean=0.5,
                        logit_std=2.0, discrete_flow_shift=3.0, generator=seeded())
    assert got.tolist() == pytest.approx([schedule_sigma(x, 3.0) for x in u], abs=1e-6)
    r = torch.rand(8, generator=seeded()).tolist()
    mode = [1 - x - 1.29 * (math.cos(math.pi * x / 2) ** 2 - 1 + x) for x in r]
    got = sample_sigmas("sigma", 8, weighting_scheme="mode", discrete_flow_shift=1.0,
                        generator=seeded())
    assert got.tolist() == pytest.approx([schedule_sigma(x, 1.0) for x in mode], abs=1e-6)
    got = sample_sigmas("sigma", 8, weighting_scheme="none", discrete_flow_shift=1.0,
                        generator=seeded())
    assert got.tolist() == pytest.approx([schedule_sigma(x, 1.0) for x in r], abs=1e-6)


def test_sampling_repeats_with_the_seed_and_stays_in_range():
    for method in ("sigma", "uniform", "sigmoid", "shift", "flux_shift"):
        a = sample_sigmas(method, 64, generator=seeded(3))
        assert torch.equal(a, sample_sigmas(method, 64, generator=seeded(3)))
        assert a.shape == (64,) and a.dtype == torch.float32
        assert 0.0 <= a.min() and a.max() <= 1.0


def test_flux_shift_gives_larger_images_more_noise():
    small = sample_sigmas("flux_shift", 2000, latent_size=(32, 32), generator=seeded())
    large = sample_sigmas("flux_shift", 2000, latent_size=(128, 128), generator=seeded())
    assert torch.all(large > small)  # the same draws: 256 tokens (mu 0.5) vs 4096 (mu 1.15)


def test_prediction_types_by_hand():
    pred, noisy = torch.ones(2, 1, 2, 2), torch.full((2, 1, 2, 2), 2.0)
    sigmas = torch.tensor([0.25, 0.5])
    assert apply_prediction_type(pred, noisy, sigmas, "raw") is pred
    assert torch.all(apply_prediction_type(pred, noisy, sigmas, "additive") == 3.0)
    scaled = apply_prediction_type(pred, noisy, sigmas, "sigma_scaled")
    assert scaled[:, 0, 0, 0].tolist() == [1.75, 1.5]  # 2 - 0.25 * 1, 2 - 0.5 * 1
    with pytest.raises(ValueError, match="model prediction type"):
        apply_prediction_type(pred, noisy, sigmas, "epsilon")


def test_sigma_scaled_turns_the_true_velocity_into_the_latents():
    latents, noise = torch.randn(2, 4, 4, 4, generator=seeded()), torch.randn(
        2, 4, 4, 4, generator=seeded(1))
    sigmas = torch.tensor([0.3, 0.9])
    noisy = noisy_latents(latents, noise, sigmas)
    x0 = apply_prediction_type(velocity_target(latents, noise), noisy, sigmas, "sigma_scaled")
    assert torch.allclose(x0, latents, atol=1e-6)


def test_loss_weights_by_hand():
    sigmas = torch.tensor([0.5, 0.25])
    assert loss_weights("sigma_sqrt", sigmas).tolist() == [4.0, 16.0]
    # 2 / (pi * (1 - 2 s + 2 s^2)): s = 0.5 -> 2 / (pi * 0.5); s = 0.25 -> 2 / (pi * 0.625)
    assert loss_weights("cosmap", sigmas).tolist() == pytest.approx(
        [4 / math.pi, 3.2 / math.pi])
    for scheme in ("none", "uniform", "logit_normal", "mode"):
        assert loss_weights(scheme, sigmas).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="weighting scheme"):
        loss_weights("snr", sigmas)


def test_only_sigma_scaled_weighs_the_loss_as_sd_scripts_does():
    sigmas = torch.tensor([0.5])
    assert prediction_loss_weights("raw", "sigma_sqrt", sigmas) is None
    assert prediction_loss_weights("additive", "cosmap", sigmas) is None
    assert prediction_loss_weights("sigma_scaled", "sigma_sqrt", sigmas).tolist() == [4.0]
    with pytest.raises(ValueError):
        prediction_loss_weights("v", "none", sigmas)


def test_unknown_sampling_is_refused_by_name():
    with pytest.raises(ValueError, match="timestep sampling 'logit'"):
        sample_sigmas("logit", 2)


def test_defaults_are_the_working_ones_and_sd_scripts_are_kept_for_the_help():
    assert (DEFAULTS["guidance_scale"], DEFAULTS["model_prediction_type"],
            DEFAULTS["timestep_sampling"]) == (1.0, "raw", "flux_shift")
    assert (SD_SCRIPTS_DEFAULTS["guidance_scale"], SD_SCRIPTS_DEFAULTS["model_prediction_type"],
            SD_SCRIPTS_DEFAULTS["timestep_sampling"]) == (3.5, "sigma_scaled", "sigma")
    assert SD_SCRIPTS_DEFAULTS["discrete_flow_shift"] == 3.0
    assert SD_SCRIPTS_DEFAULTS["mode_scale"] == 1.29
