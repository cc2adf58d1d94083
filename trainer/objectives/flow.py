"""Flow matching (rectified flow), the objective of FLUX.1 and SD 3.x, as small pure functions.

Esser et al. 2024, "Scaling Rectified Flow Transformers for High-Resolution Image Synthesis"
(arXiv:2403.03206, "SD3 paper" below): the noisy input is the straight line between the data
and the noise, ``x_t = (1 - sigma) * x_0 + sigma * noise`` (rectified flow, section 3), and the
model learns its velocity ``noise - x_0``; section 3.1 shapes where on the line training
samples (logit-normal, mode, CosMap), section 5.3.2 shifts it with the resolution.

The options, their names and their formulas are sd-scripts' (kohya-ss/sd-scripts,
``library/flux_train_utils.py``: ``get_noisy_model_input_and_timesteps``,
``apply_model_prediction_type``, ``time_shift``, ``get_lin_function``), so a config moved from
kohya_ss trains the same way. The density of ``weighting_scheme`` and its loss weights are
diffusers' own functions (``diffusers.training_utils``), called, not rewritten.

Sigmas are one number per image, shape [B], in [0, 1] (1 = pure noise); the functions broadcast
them over the latents. Random draws come from ``generator`` on the CPU, so a seeded run repeats
on any device; the caller moves the result.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Optional

import torch

NUM_TRAIN_TIMESTEPS = 1000  # FLUX.1 and SD3 both: timestep = sigma * 1000
TIMESTEP_SAMPLINGS = ("sigma", "uniform", "sigmoid", "shift", "flux_shift")
# "uniform" is sd-scripts' default and behaves as "none" (its --weighting_scheme help says so)
WEIGHTING_SCHEMES = ("none", "uniform", "logit_normal", "mode", "cosmap", "sigma_sqrt")
PREDICTION_TYPES = ("raw", "additive", "sigma_scaled")

# The defaults that work (sd-scripts' docs/flux_train_network.md recommends them) and
# sd-scripts' own argparse defaults, for the help text: a setting's schema reads both from here.
DEFAULTS = {
    "timestep_sampling": "flux_shift", "discrete_flow_shift": 3.0, "sigmoid_scale": 1.0,
    "weighting_scheme": "none", "logit_mean": 0.0, "logit_std": 1.0, "mode_scale": 1.29,
    "model_prediction_type": "raw", "guidance_scale": 1.0,
}
SD_SCRIPTS_DEFAULTS = {**DEFAULTS, "timestep_sampling": "sigma", "weighting_scheme": "uniform",
                       "model_prediction_type": "sigma_scaled", "guidance_scale": 3.5}

# FLUX.1's resolution-dependent shift: mu runs linearly from 0.5 at 256 image tokens to 1.15 at
# 4096 (BFL's ``get_schedule``; sd-scripts' ``get_lin_function(y1=0.5, y2=1.15)``; the
# ``base_shift`` / ``max_shift`` of FLUX.1's scheduler config).
FLUX_BASE_SEQ_LEN, FLUX_MAX_SEQ_LEN = 256, 4096
FLUX_BASE_SHIFT, FLUX_MAX_SHIFT = 0.5, 1.15


def per_image(sigmas: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sigmas [B] viewed as [B, 1, ..., 1] to broadcast over ``like``, in its device and dtype."""
    return sigmas.to(like.device, like.dtype).view(-1, *([1] * (like.ndim - 1)))


def noisy_latents(latents: torch.Tensor, noise: torch.Tensor,
                  sigmas: torch.Tensor) -> torch.Tensor:
    """The point at ``sigmas`` on the line from the latents to the noise:
    ``(1 - sigma) * latents + sigma * noise`` (SD3 paper section 3; sd-scripts'
    ``noisy_model_input``; diffusers' ``FlowMatchEulerDiscreteScheduler.scale_noise``)."""
    s = per_image(sigmas, latents)
    return (1.0 - s) * latents + s * noise


def velocity_target(latents: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """What the transformer learns to predict: ``noise - latents``, the constant velocity of
    the straight path (SD3 paper section 3; sd-scripts' FLUX.1 ``target = noise - latents``)."""
    return noise - latents


def timesteps_of(sigmas: torch.Tensor) -> torch.Tensor:
    """The timestep the transformer is given: ``sigma * 1000`` (diffusers' SD3 transformer takes
    it so; FLUX.1's takes it divided by 1000 again, as sd-scripts and FluxPipeline pass it)."""
    return sigmas * NUM_TRAIN_TIMESTEPS


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """The timestep shift ``shift * s / (1 + (shift - 1) * s)`` (SD3 paper section 5.3.2,
    with ``shift`` = sqrt(m / n) for m and n pixels): above 1 it moves samples towards noise.
    sd-scripts' ``--timestep_sampling shift`` with ``--discrete_flow_shift``; the same formula
    gives ``FlowMatchEulerDiscreteScheduler(shift=...)``'s sigmas."""
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def time_shift(sigmas: torch.Tensor, mu: float) -> torch.Tensor:
    """FLUX.1's exponential shift ``e^mu / (e^mu + (1 / s - 1))`` (BFL's ``time_shift`` with
    sigma 1, sd-scripts' ``time_shift``, diffusers' ``FlowMatchEulerDiscreteScheduler.time_shift``
    of type "exponential"). It equals :func:`shift_sigmas` with ``shift = e^mu``."""
    return math.exp(mu) / (math.exp(mu) + (1.0 / sigmas - 1.0))


def image_seq_len(latent_height: int, latent_width: int, patch_size: int = 2) -> int:
    """The number of image tokens of FLUX.1's packed latents: one per 2x2 patch (sd-scripts'
    flux_shift uses ``(h // 2) * (w // 2)`` of the unpacked latents)."""
    return (latent_height // patch_size) * (latent_width // patch_size)


FLUX_SHIFT_LINE = (FLUX_BASE_SEQ_LEN, FLUX_MAX_SEQ_LEN, FLUX_BASE_SHIFT, FLUX_MAX_SHIFT)


def flux_mu(seq_len: int, line: Optional[tuple[int, int, float, float]] = None) -> float:
    """FLUX.1's ``mu`` for ``seq_len`` image tokens: linear from 0.5 at 256 tokens to 1.15 at
    4096 (diffusers' ``calculate_shift``, which FluxPipeline uses; sd-scripts'
    ``get_lin_function(y1=0.5, y2=1.15)``). 512 px: 1024 tokens, mu 0.63; 1024 px: 1.15.
    ``line``: another model's (base tokens, max tokens, base shift, max shift), its scheduler's
    dynamic shift (:func:`shift_line`)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return float(calculate_shift(seq_len, *(line or FLUX_SHIFT_LINE)))


def shift_line(scheduler: Any) -> Optional[tuple[int, int, float, float]]:
    """The dynamic shift of a model's flow scheduler, where its config has one
    (``use_dynamic_shifting``: FLUX.1's 256 -> 4096 tokens, 0.5 -> 1.15; Qwen-Image's 256 ->
    8192, 0.5 -> 0.9, which is musubi-tuner's ``qwen_shift``); None otherwise (FLUX.1's
    line then applies)."""
    config = getattr(scheduler, "config", None)
    if config is None or not config.get("use_dynamic_shifting"):
        return None
    return (int(config["base_image_seq_len"]), int(config["max_image_seq_len"]),
            float(config["base_shift"]), float(config["max_shift"]))


@lru_cache(maxsize=8)
def _train_sigmas(shift: float) -> torch.Tensor:
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS,
                                                shift=shift)
    return scheduler.sigmas.clone()


def density_sigmas(batch_size: int, weighting_scheme: str, discrete_flow_shift: float,
                   logit_mean: float = 0.0, logit_std: float = 1.0, mode_scale: float = 1.29,
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """sd-scripts' ``--timestep_sampling sigma``: ``u`` from the ``weighting_scheme``'s density
    (diffusers' ``compute_density_for_timestep_sampling``: ``logit_normal`` is
    sigmoid(N(mean, std)); ``mode`` is mode sampling with heavy tails, scale ``mode_scale``;
    both SD3 paper section 3.1; anything else is uniform), then the sigma at index
    ``int(u * 1000)`` of the training schedule of ``FlowMatchEulerDiscreteScheduler(shift=
    discrete_flow_shift)``, which runs from 1 down to 1/1000 (so small u is heavy noise).
    The index is clamped into the schedule (u = 1 exactly would be one past its end)."""
    from diffusers.training_utils import compute_density_for_timestep_sampling

    u = compute_density_for_timestep_sampling(weighting_scheme, batch_size, logit_mean,
                                              logit_std, mode_scale, generator=generator)
    sigmas = _train_sigmas(float(discrete_flow_shift))
    indices = (u * NUM_TRAIN_TIMESTEPS).long().clamp(0, len(sigmas) - 1)
    return sigmas[indices]


def sigmoid_normal(batch_size: int, sigmoid_scale: float = 1.0,
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``sigmoid(sigmoid_scale * N(0, 1))`` (x-flux's sampling, sd-scripts' ``sigmoid``; the
    logit-normal of the SD3 paper, section 3.1, with std = sigmoid_scale)."""
    return torch.sigmoid(sigmoid_scale * torch.randn(batch_size, generator=generator))


def sample_sigmas(method: str, batch_size: int, *, latent_size: tuple[int, int] = (64, 64),
                  discrete_flow_shift: float = 3.0, sigmoid_scale: float = 1.0,
                  weighting_scheme: str = "none", logit_mean: float = 0.0,
                  logit_std: float = 1.0, mode_scale: float = 1.29,
                  generator: Optional[torch.Generator] = None,
                  line: Optional[tuple[int, int, float, float]] = None) -> torch.Tensor:
    """One sigma per image by sd-scripts' ``--timestep_sampling`` ``method``
    (``get_noisy_model_input_and_timesteps``), drawn on the CPU:

    - ``uniform``: U[0, 1); ``sigmoid``: :func:`sigmoid_normal`;
    - ``shift``: :func:`sigmoid_normal`, then :func:`shift_sigmas` by ``discrete_flow_shift``;
    - ``flux_shift``: :func:`sigmoid_normal`, then :func:`time_shift` by :func:`flux_mu` of the
      latents' (height, width) ``latent_size``, unpacked: larger images get noisier steps
      (``line``: the model scheduler's own :func:`shift_line`, else FLUX.1's);
    - ``sigma``: :func:`density_sigmas` (``weighting_scheme``, ``logit_mean`` / ``logit_std``,
      ``mode_scale`` and ``discrete_flow_shift`` matter only here).
    """
    if method == "uniform":
        return torch.rand(batch_size, generator=generator)
    if method == "sigmoid":
        return sigmoid_normal(batch_size, sigmoid_scale, generator)
    if method == "shift":
        return shift_sigmas(sigmoid_normal(batch_size, sigmoid_scale, generator),
                            discrete_flow_shift)
    if method == "flux_shift":
        mu = flux_mu(image_seq_len(*latent_size), line)
        return time_shift(sigmoid_normal(batch_size, sigmoid_scale, generator), mu)
    if method == "sigma":
        return density_sigmas(batch_size, weighting_scheme, discrete_flow_shift, logit_mean,
                              logit_std, mode_scale, generator)
    raise ValueError(f"unknown timestep sampling {method!r}; one of {TIMESTEP_SAMPLINGS}")


def apply_prediction_type(pred: torch.Tensor, noisy: torch.Tensor, sigmas: torch.Tensor,
                          prediction_type: str = "raw") -> torch.Tensor:
    """sd-scripts' ``--model_prediction_type`` (``apply_model_prediction_type``): ``raw`` keeps
    the prediction (x-flux; the one its docs recommend); ``additive`` adds the noisy input;
    ``sigma_scaled`` gives ``noisy - sigma * pred``, the x_0 estimate of SD3's training
    (sd-scripts' ``sd3_train_network.py``, whose target is then the latents, not the velocity;
    sd-scripts' FLUX.1 trainer still compares it with ``noise - latents``)."""
    if prediction_type == "raw":
        return pred
    if prediction_type == "additive":
        return pred + noisy
    if prediction_type == "sigma_scaled":
        return pred * -per_image(sigmas, pred) + noisy
    raise ValueError(f"unknown model prediction type {prediction_type!r}; one of "
                     f"{PREDICTION_TYPES}")


def loss_weights(weighting_scheme: str, sigmas: torch.Tensor) -> torch.Tensor:
    """Per-image loss weights [B] of ``weighting_scheme`` (diffusers'
    ``compute_loss_weighting_for_sd3``): ``sigma_sqrt`` is ``sigma**-2``; ``cosmap`` is
    ``2 / (pi * (1 - 2 sigma + 2 sigma**2))`` (the CosMap density of SD3 paper section 3.1, as
    a weight); every other scheme weighs 1 (``logit_normal`` and ``mode`` shape the sampling
    instead)."""
    from diffusers.training_utils import compute_loss_weighting_for_sd3

    if weighting_scheme not in WEIGHTING_SCHEMES:
        raise ValueError(f"unknown weighting scheme {weighting_scheme!r}; one of "
                         f"{WEIGHTING_SCHEMES}")
    return compute_loss_weighting_for_sd3(weighting_scheme, sigmas.float())


def prediction_loss_weights(prediction_type: str, weighting_scheme: str,
                            sigmas: torch.Tensor) -> Optional[torch.Tensor]:
    """The weights sd-scripts applies to the loss: :func:`loss_weights` with ``sigma_scaled``,
    None (unweighted) with ``raw`` and ``additive`` (``apply_model_prediction_type``)."""
    if prediction_type not in PREDICTION_TYPES:
        raise ValueError(f"unknown model prediction type {prediction_type!r}; one of "
                         f"{PREDICTION_TYPES}")
    return loss_weights(weighting_scheme, sigmas) if prediction_type == "sigma_scaled" else None
