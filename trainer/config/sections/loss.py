"""[training] options of the loss (trainer/objectives/losses.py): its function (l2, l1, Huber),
the weightings of the timesteps (min-SNR, debiased estimation, the v-prediction terms), the mask
and the prior-preservation weight."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import DDPM, Section, setting


class LossOptions(Section):
    """The loss options, mixed into :class:`trainer.config.sections.training.TrainingSection`."""

    min_snr_gamma: Optional[float] = setting(
        None, "Min-SNR loss weighting gamma (Hang et al. 2023); 5 is the paper's value.",
        advanced=True, gt=0, le=100,
        label="Min-SNR gamma",
        families=DDPM,
    )
    debiased_estimation_loss: bool = setting(
        False, "Weight the loss by 1/sqrt(SNR) (1/(SNR+1) for v-prediction), Yu et al. 2023; "
        "sd-scripts' option of the same name.", advanced=True,
        label="Debiased estimation loss",
        families=DDPM,
    )
    scale_v_pred_loss_like_noise_pred: bool = setting(
        False, "v-prediction only: scale the loss by SNR/(SNR+1) so that it weighs timesteps "
        "like an epsilon-prediction loss.", advanced=True,
        label="Scale v-prediction loss like noise prediction",
        families=DDPM,
    )
    v_pred_like_loss: Optional[float] = setting(
        None, "Add this times a v-prediction-like loss: each image's loss times "
        "(1 + this x (SNR+1)/SNR) (sd-scripts' --v_pred_like_loss).", advanced=True, gt=0,
        le=10, families=DDPM,
        label="v-prediction-like loss",
    )
    loss_type: Literal["l2", "huber", "smooth_l1", "l1"] = setting(
        "l2", "Loss function: l2 (mean squared error), l1, or the scheduled pseudo-Huber "
        "huber / smooth_l1 (Khrapov & Popov 2024), less sensitive to outliers.", advanced=True,
        label="Loss type",
    )
    huber_schedule: Literal["constant", "exponential", "snr"] = setting(
        "snr", "How the Huber parameter changes with the timestep (huber and smooth_l1 only).",
        advanced=True,
        label="Huber schedule",
    )
    huber_c: float = setting(
        0.1, "Huber parameter c: the constant value, or where the schedules end "
        "(huber and smooth_l1 only).", advanced=True, gt=0, le=1,
        label="Huber c",
    )
    huber_scale: float = setting(
        1.0, "Multiplies the constant and exponential Huber schedules (huber and smooth_l1 "
        "only).", advanced=True, gt=0, le=100,
        label="Huber scale",
    )
    masked_loss: bool = setting(
        False, "Train only where a mask is white: the mask is the image's alpha channel "
        "(dataset.alpha_mask) or an image in dataset.mask_data_dir.", advanced=True,
        label="Masked loss",
    )
    prior_loss_weight: float = setting(
        1.0, "Weight of the regularization images' loss.", modes=("lora", "dreambooth"),
        advanced=True, ge=0, le=100,
        label="Prior-preservation loss weight",
    )
