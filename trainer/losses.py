"""The math of the diffusion loss, as small pure functions with their sources."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def offset_noise(
    noise: torch.Tensor, offset: Optional[float], generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """Noise offset: add a per-image, per-channel constant to the noise.

    N. Guttenberg, "Diffusion with Offset Noise" (crosslabs.org, 2023): lets the model learn
    images whose mean brightness is far from 0.5.
    """
    if not offset:
        return noise
    shift = torch.randn(
        noise.shape[0], noise.shape[1], 1, 1, generator=generator, device="cpu"
    ).to(noise.device, noise.dtype)
    return noise + offset * shift


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


def diffusion_loss(
    pred: torch.Tensor, target: torch.Tensor, weights: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Mean squared error per image, times an optional per-image weight, averaged."""
    per_image = F.mse_loss(pred.float(), target.float(), reduction="none")
    per_image = per_image.mean(dim=tuple(range(1, per_image.ndim)))
    if weights is not None:
        per_image = per_image * weights.to(per_image.device, per_image.dtype)
    return per_image.mean()
