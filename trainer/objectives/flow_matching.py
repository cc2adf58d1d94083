"""The flow-matching objective of FLUX.1 and SD 3.5 as one object the step calls.

The same methods as :class:`~trainer.objectives.ddpm.DDPMObjective`, with the functions of
:mod:`trainer.objectives.flow` and the ``[flow]`` settings: noise is plain Gaussian, ``t`` is
one sigma per image in [0, 1] (the family turns it into the transformer's timestep), the noisy
input is the point on the line from the latents to the noise, the target the velocity
``noise - latents`` (or the latents with ``sigma_scaled``, whose prediction is an estimate of
them: sd-scripts' SD3 trainer compares it so; its FLUX.1 trainer compares it with the velocity,
which mixes two quantities, so here both families use the latents).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer.objectives import flow
from trainer.objectives.losses import huber_threshold

VALIDATION_SIGMAS = (0.1, 0.3, 0.5, 0.7, 0.9)


class FlowObjective:
    """``settings``: the config's ``flow`` section; ``training``: its ``training`` section;
    ``scheduler``: the model's flow scheduler, whose dynamic shift ``flux_shift`` follows (FLUX.1's
    line without one)."""

    def __init__(self, settings: Any, training: Any, scheduler: Any = None):
        self.flow, self.tr = settings, training
        self.line = flow.shift_line(scheduler)

    def sample_noise(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.randn_like(latents)

    def sample_t(self, latents: torch.Tensor) -> torch.Tensor:
        """Sigmas by ``flow.timestep_sampling``, drawn from the global generator (seeded and
        saved with the training state, so a resume draws the same)."""
        f = self.flow
        sigmas = flow.sample_sigmas(
            f.timestep_sampling, latents.shape[0], latent_size=tuple(latents.shape[-2:]),
            discrete_flow_shift=f.discrete_flow_shift, sigmoid_scale=f.sigmoid_scale,
            weighting_scheme=f.weighting_scheme, logit_mean=f.logit_mean,
            logit_std=f.logit_std, mode_scale=f.mode_scale, line=self.line)
        return sigmas.to(latents.device)

    def noisy(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return flow.noisy_latents(latents, noise, t)

    def prediction(self, pred: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return flow.apply_prediction_type(pred, noisy, t, self.flow.model_prediction_type)

    def target(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.flow.model_prediction_type == "sigma_scaled":
            return latents  # the prediction is then an estimate of the clean latents
        return flow.velocity_target(latents, noise)

    def weights(self, base: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        scheme = flow.prediction_loss_weights(self.flow.model_prediction_type,
                                              self.flow.weighting_scheme, t)
        weights = base.float()
        return weights if scheme is None else weights * scheme.to(weights.device)

    def huber_c(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        tr = self.tr
        if tr.loss_type not in ("huber", "smooth_l1"):
            return None
        return huber_threshold(tr.huber_schedule, tr.huber_c, tr.huber_scale,
                               flow.timesteps_of(t), flow.NUM_TRAIN_TIMESTEPS)

    def validation_t(self) -> torch.Tensor:
        return torch.tensor(VALIDATION_SIGMAS)
