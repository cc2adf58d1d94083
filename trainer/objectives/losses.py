"""The math of the diffusion loss, as small pure functions with their sources.

Where a function matches an sd-scripts option (kohya-ss/sd-scripts, ``library/train_util.py``
and ``library/custom_train_functions.py``), its docstring names the option; the defaults and the
formulas are sd-scripts', so a config moved from kohya_ss trains the same way.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F

# sd-scripts caps the SNR at 1000 where it divides by it (t = 0 has a huge SNR).
SNR_CAP = 1000.0
LOSS_TYPES = ("l2", "huber", "smooth_l1", "l1")
HUBER_SCHEDULES = ("constant", "exponential", "snr")


def offset_noise(
    noise: torch.Tensor, offset: Optional[float], generator: Optional[torch.Generator] = None,
    *, latents: Optional[torch.Tensor] = None, adaptive_scale: Optional[float] = None,
    random_strength: bool = False,
) -> torch.Tensor:
    """Noise offset: add a per-image, per-channel constant to the noise.

    N. Guttenberg, "Diffusion with Offset Noise" (crosslabs.org, 2023): lets the model learn
    images whose mean brightness is far from 0.5. sd-scripts' extras:
    ``--noise_offset_random_strength`` draws the strength uniformly in [0, offset) per batch, and
    ``--adaptive_noise_scale`` adds ``scale * |channel mean of the latents|`` to it (clamped at 0).
    """
    if not offset:
        return noise
    strength: Union[float, torch.Tensor] = offset
    if random_strength:
        strength = torch.rand(1, generator=generator, device="cpu").item() * offset
    if adaptive_scale is not None and latents is not None:
        channel_mean = latents.float().mean(dim=(2, 3), keepdim=True).abs()
        strength = torch.clamp(strength + adaptive_scale * channel_mean, min=0.0)
    shift = torch.randn(
        noise.shape[0], noise.shape[1], 1, 1, generator=generator, device="cpu"
    ).to(noise.device, noise.dtype)
    return noise + (strength * shift).to(noise.dtype)


def pyramid_noise(
    noise: torch.Tensor, iterations: int, discount: float,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Multi-resolution ("pyramid") noise, sd-scripts' ``--multires_noise_iterations`` and
    ``--multires_noise_discount`` (default 0.3).

    J. Whitaker, "Multi-Resolution Noise for Diffusion Model Training" (wandb report, 2023):
    level i adds noise drawn at the size divided by r**i (r uniform in [2, 4)), upsampled
    bilinearly and weighted by discount**i, down to 1 pixel; the sum is rescaled to unit std.
    The draws come from ``generator`` (the CPU's default one when None), in level order.
    """
    b, c, h, w = noise.shape
    out = noise
    for i in range(iterations):
        r = float(torch.rand((), generator=generator)) * 2 + 2
        hn, wn = max(1, int(h / r**i)), max(1, int(w / r**i))
        level = torch.randn(b, c, hn, wn, generator=generator).to(noise.device, torch.float32)
        level = F.interpolate(level, size=(h, w), mode="bilinear", align_corners=False)
        out = out + (level * discount**i).to(out.dtype)
        if hn == 1 or wn == 1:
            break
    return out / out.std()


def sample_timesteps(
    batch_size: int, num_train_timesteps: int, min_timestep: Optional[int],
    max_timestep: Optional[int], device: torch.device,
) -> torch.Tensor:
    """Timesteps drawn uniformly in [min_timestep, max_timestep), sd-scripts' ``--min_timestep``
    (default 0) and ``--max_timestep`` (default: the schedule's length, exclusive)."""
    low = 0 if min_timestep is None else min_timestep
    high = num_train_timesteps if max_timestep is None else max_timestep
    if high > num_train_timesteps or low >= high:
        raise ValueError(
            f"training.min_timestep / training.max_timestep = {low} / {high}: they must satisfy "
            f"0 <= min < max <= {num_train_timesteps} (the model's number of timesteps)")
    return torch.randint(low, high, (batch_size,), device=device).long()


def target_for(
    prediction_type: str, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor,
    scheduler,
) -> torch.Tensor:
    """What the UNet should predict: the noise (epsilon) or the velocity v.

    v-prediction: Salimans & Ho, "Progressive Distillation for Fast Sampling of Diffusion
    Models" (2022), v = alpha_t * noise - sigma_t * x0, as diffusers' ``get_velocity`` computes.
    """
    if prediction_type == "epsilon":
        return noise
    if prediction_type == "v_prediction":
        return scheduler.get_velocity(latents, noise, timesteps)
    raise ValueError(f"unknown prediction type {prediction_type!r}")


def min_snr_weights(snr_t: torch.Tensor, gamma: float, prediction_type: str) -> torch.Tensor:
    """Min-SNR-gamma loss weights.

    Hang et al., "Efficient Diffusion Training via Min-SNR Weighting Strategy" (ICCV 2023):
    weight = min(SNR, gamma) / SNR for epsilon targets; for v targets the denominator is SNR + 1.
    ``snr_t`` comes from diffusers' ``training_utils.compute_snr``.
    """
    if prediction_type == "v_prediction":
        return torch.clamp(snr_t, max=gamma) / (snr_t + 1.0)
    # min(SNR, gamma) / SNR written so that SNR = 0 (zero terminal SNR) gives 1, not 0/0
    return torch.clamp(gamma / snr_t, max=1.0)


def debiased_weights(snr_t: torch.Tensor, prediction_type: str) -> torch.Tensor:
    """Debiased estimation loss weights, sd-scripts' ``--debiased_estimation_loss``.

    Yu et al., "Debias the Training of Diffusion Models" (arXiv:2310.08442, 2023): weight
    1 / sqrt(SNR) for epsilon targets, 1 / (SNR + 1) for v targets, the SNR capped at 1000.
    """
    snr = torch.clamp(snr_t, max=SNR_CAP)
    if prediction_type == "v_prediction":
        return 1.0 / (snr + 1.0)
    return 1.0 / torch.sqrt(snr)


def v_pred_like_noise_pred_weights(snr_t: torch.Tensor) -> torch.Tensor:
    """SNR / (SNR + 1), SNR capped at 1000: sd-scripts' ``--scale_v_pred_loss_like_noise_pred``.

    A v-prediction loss equals (SNR + 1) times the epsilon loss at the same error in x0; this
    weight puts it on the scale of an epsilon-prediction loss (as sd-scripts' ``get_snr_scale``).
    """
    snr = torch.clamp(snr_t, max=SNR_CAP)
    return snr / (snr + 1.0)


def input_perturbation(noise: torch.Tensor, gamma: float, random_strength: bool = False
                       ) -> torch.Tensor:
    """The noise that goes into the noisy latents with input perturbation, sd-scripts'
    ``--ip_noise_gamma`` (and ``--ip_noise_gamma_random_strength``: gamma drawn uniformly in
    [0, gamma) per batch). Ning et al., "Input Perturbation Reduces Exposure Bias in Diffusion
    Models" (ICML 2023): x_t is made from noise + gamma * xi with a fresh xi, while the target
    stays the original noise."""
    strength = torch.rand(1, device=noise.device) * gamma if random_strength else gamma
    return noise + strength * torch.randn_like(noise)


def v_pred_like_weights(snr_t: torch.Tensor, amount: float) -> torch.Tensor:
    """1 + amount / (SNR / (SNR + 1)), SNR capped at 1000: sd-scripts' ``--v_pred_like_loss``
    (``add_v_prediction_like_loss``: loss + loss / scale * amount, with the scale of
    :func:`v_pred_like_noise_pred_weights`), as a per-image weight."""
    return 1.0 + amount / v_pred_like_noise_pred_weights(snr_t)


def huber_threshold(
    schedule: str, huber_c: float, huber_scale: float, timesteps: torch.Tensor,
    num_train_timesteps: int, snr_t: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The per-image Huber parameter c(t), sd-scripts' ``--huber_schedule`` / ``--huber_c`` /
    ``--huber_scale`` (``get_huber_threshold_if_needed``).

    Khrapov & Popov, "Improving Diffusion Models's Data-Corruption Resistance using Scheduled
    Pseudo-Huber Loss" (arXiv:2403.16728, 2024): ``constant``: c * scale; ``exponential``:
    exp(t * ln(c) / T) * scale, from 1 at t = 0 down to c at t = T; ``snr``:
    (1 - c) / (1 + sigma_t)**2 + c with sigma_t = sqrt((1 - alphabar_t) / alphabar_t)
    = 1 / sqrt(SNR_t) (sd-scripts applies no scale to this one).
    """
    if schedule == "constant":
        return torch.full(timesteps.shape, huber_c * huber_scale, device=timesteps.device)
    if schedule == "exponential":
        alpha = -math.log(huber_c) / num_train_timesteps
        return torch.exp(-alpha * timesteps.float()) * huber_scale
    if schedule == "snr":
        if snr_t is None:
            raise ValueError("the snr Huber schedule needs the SNR of the timesteps")
        sigmas = torch.rsqrt(snr_t.float())
        return (1.0 - huber_c) / (1.0 + sigmas) ** 2 + huber_c
    raise ValueError(f"unknown Huber schedule {schedule!r}; one of {HUBER_SCHEDULES}")


def elementwise_loss(
    pred: torch.Tensor, target: torch.Tensor, loss_type: str = "l2",
    huber_c: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The loss of every element, sd-scripts' ``--loss_type`` (``conditional_loss``).

    ``huber`` is the pseudo-Huber loss 2c (sqrt(d^2 + c^2) - c) and ``smooth_l1`` its form
    2 (sqrt(d^2 + c^2) - c) (Khrapov & Popov 2024), with ``huber_c`` one value per image.
    """
    if loss_type == "l2":
        return F.mse_loss(pred, target, reduction="none")
    if loss_type == "l1":
        return F.l1_loss(pred, target, reduction="none")
    if loss_type in ("huber", "smooth_l1"):
        if huber_c is None:
            raise ValueError(f"loss_type {loss_type!r} needs huber_c")
        c = huber_c.to(pred.device, pred.dtype).view(-1, *([1] * (pred.ndim - 1)))
        smooth = 2 * (torch.sqrt((pred - target) ** 2 + c**2) - c)
        return c * smooth if loss_type == "huber" else smooth
    raise ValueError(f"unknown loss type {loss_type!r}; one of {LOSS_TYPES}")


def diffusion_loss(
    pred: torch.Tensor, target: torch.Tensor, weights: Optional[torch.Tensor] = None,
    loss_type: str = "l2", huber_c: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The per-element loss (``elementwise_loss``), times an optional per-pixel ``mask``
    [B, 1, h, w] in 0..1 (masked loss, as sd-scripts' ``apply_masked_loss``: masked-out pixels
    count as zeros in the mean), averaged per image, times an optional per-image weight,
    averaged."""
    per_image = elementwise_loss(pred.float(), target.float(), loss_type, huber_c)
    if mask is not None:
        per_image = per_image * mask.to(per_image.device, per_image.dtype)
    per_image = per_image.mean(dim=tuple(range(1, per_image.ndim)))
    if weights is not None:
        per_image = per_image * weights.to(per_image.device, per_image.dtype)
    return per_image.mean()
