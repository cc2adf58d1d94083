"""[training] settings of sd-scripts' noise and loss options that came with issue 21 (kept in a
module of their own so that training.py stays short): input-perturbation noise and the
v-prediction-like loss term. The math is in trainer/objectives/losses.py."""

from __future__ import annotations

from typing import Optional

from trainer.config.sections.base import Section, setting

_SD = ("sd1", "sd2", "sdxl")


class TrainingParity(Section):
    ip_noise_gamma: Optional[float] = setting(
        None, "Input-perturbation noise (Ning et al. 2023): the noisy latents get this much "
        "extra Gaussian noise that the target does not contain; 0.1 is the paper's value "
        "(sd-scripts' --ip_noise_gamma).", advanced=True, gt=0, le=1, families=_SD,
        label="Input-perturbation noise gamma",
    )
    ip_noise_gamma_random_strength: bool = setting(
        False, "Draw the input-perturbation strength uniformly between 0 and ip_noise_gamma "
        "for every batch (sd-scripts' option of the same name).", advanced=True, families=_SD,
        label="Random input-perturbation strength",
    )
    v_pred_like_loss: Optional[float] = setting(
        None, "Add this times a v-prediction-like loss: each image's loss times "
        "(1 + this x (SNR+1)/SNR) (sd-scripts' --v_pred_like_loss).", advanced=True, gt=0,
        le=10, families=_SD,
        label="v-prediction-like loss",
    )
