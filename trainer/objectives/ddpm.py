"""The DDPM objective of SD 1.x, 2.x and SDXL as one object the step calls.

Noise with the offset and multires options, integer timesteps in [min, max), the scheduler's
``add_noise``, the epsilon or v target and sd-scripts' per-image weights (min-SNR, v-pred-like
scaling, debiased estimation) and Huber schedule: each a function of
:mod:`trainer.objectives.losses`; this class only holds the config and the noise schedule and
calls them in sd-scripts' order. :class:`~trainer.objectives.flow_matching.FlowObjective` has
the same methods, so the step reads the same for every family.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.objectives.losses import (
    debiased_weights,
    huber_threshold,
    input_perturbation,
    min_snr_weights,
    offset_noise,
    pyramid_noise,
    sample_timesteps,
    target_for,
    v_pred_like_noise_pred_weights,
    v_pred_like_weights,
)

# Where on the noise schedule the validation loss scores each image (fractions of its length).
VALIDATION_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)


class DDPMObjective:
    """``scheduler``: the model's DDPM noise schedule; ``prediction_type``: epsilon or v."""

    def __init__(self, training: Any, scheduler: Any, prediction_type: str):
        self.tr, self.scheduler, self.prediction_type = training, scheduler, prediction_type
        self.num_timesteps = scheduler.config.num_train_timesteps

    def sample_noise(self, latents: torch.Tensor) -> torch.Tensor:
        """Gaussian noise, with the noise offset and multires options (offset first, as
        sd-scripts)."""
        tr = self.tr
        noise = torch.randn_like(latents)
        if tr.noise_offset:
            noise = offset_noise(noise, tr.noise_offset, latents=latents,
                                 adaptive_scale=tr.adaptive_noise_scale,
                                 random_strength=tr.noise_offset_random_strength)
        if tr.multires_noise_iterations:
            noise = pyramid_noise(noise, tr.multires_noise_iterations,
                                  tr.multires_noise_discount)
        return noise

    def sample_t(self, latents: torch.Tensor) -> torch.Tensor:
        return sample_timesteps(latents.shape[0], self.num_timesteps, self.tr.min_timestep,
                                self.tr.max_timestep, latents.device)

    def noisy(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.tr.ip_noise_gamma:  # the target keeps ``noise`` (Ning et al. 2023)
            noise = input_perturbation(noise, self.tr.ip_noise_gamma,
                                       self.tr.ip_noise_gamma_random_strength)
        return self.scheduler.add_noise(latents, noise, t)

    def prediction(self, pred: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return pred  # the UNet predicts the target itself

    def target(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return target_for(self.prediction_type, latents, noise, t, self.scheduler)

    def _snr(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        from diffusers.training_utils import compute_snr

        tr = self.tr
        needed = (tr.min_snr_gamma is not None or tr.debiased_estimation_loss
                  or tr.scale_v_pred_loss_like_noise_pred or tr.v_pred_like_loss
                  or (tr.loss_type in ("huber", "smooth_l1") and tr.huber_schedule == "snr"))
        return compute_snr(self.scheduler, t) if needed else None

    def weights(self, base: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Per-image weights: ``base`` (the prior loss weight), then sd-scripts' order of
        min-SNR, v-pred-like scaling and debiased estimation."""
        tr, snr, pred = self.tr, self._snr(t), self.prediction_type
        weights = base.float()
        if tr.min_snr_gamma is not None:
            weights = weights * min_snr_weights(snr, tr.min_snr_gamma, pred)
        if tr.scale_v_pred_loss_like_noise_pred:
            if pred != "v_prediction":
                raise ValueError("training.scale_v_pred_loss_like_noise_pred is for "
                                 "v-prediction models; this model predicts epsilon: turn it off")
            weights = weights * v_pred_like_noise_pred_weights(snr)
        if tr.v_pred_like_loss:
            weights = weights * v_pred_like_weights(snr, tr.v_pred_like_loss)
        if tr.debiased_estimation_loss:
            weights = weights * debiased_weights(snr, pred)
        return weights

    def huber_c(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        tr = self.tr
        if tr.loss_type not in ("huber", "smooth_l1"):
            return None
        return huber_threshold(tr.huber_schedule, tr.huber_c, tr.huber_scale, t,
                               self.num_timesteps, self._snr(t))

    def validation_t(self) -> torch.Tensor:
        """Fixed timesteps spread over the schedule, for a validation loss comparable across
        steps."""
        return torch.tensor([int(f * (self.num_timesteps - 1)) for f in VALIDATION_FRACTIONS],
                            dtype=torch.long)
