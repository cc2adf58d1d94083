"""[training] settings of sd-scripts' noise and loss options that came with issue 21 (kept in a
module of their own so that training.py stays short): input-perturbation noise and the
v-prediction-like loss term (the math is in trainer/objectives/losses.py), and the EMA of the
trained weights (trainer/run/ema.py)."""

from __future__ import annotations

from typing import Optional

from trainer.config.sections.base import DDPM, Section, setting


class TrainingParity(Section):
    ip_noise_gamma: Optional[float] = setting(
        None, "Input-perturbation noise (Ning et al. 2023): the noisy latents get this much "
        "extra Gaussian noise that the target does not contain; 0.1 is the paper's value "
        "(sd-scripts' --ip_noise_gamma).", advanced=True, gt=0, le=1, families=DDPM,
        label="Input-perturbation noise gamma",
    )
    ip_noise_gamma_random_strength: bool = setting(
        False, "Draw the input-perturbation strength uniformly between 0 and ip_noise_gamma "
        "for every batch (sd-scripts' option of the same name).", advanced=True, families=DDPM,
        label="Random input-perturbation strength",
    )
    v_pred_like_loss: Optional[float] = setting(
        None, "Add this times a v-prediction-like loss: each image's loss times "
        "(1 + this x (SNR+1)/SNR) (sd-scripts' --v_pred_like_loss).", advanced=True, gt=0,
        le=10, families=DDPM,
        label="v-prediction-like loss",
    )
    log_tracker_name: Optional[str] = setting(
        None, "Name of the run in the trackers: TensorBoard's folder under logging_dir and the "
        "W&B project (sd-scripts' --log_tracker_name); unset: saving.output_name.",
        advanced=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$", label="Tracker run name",
    )
    wandb_run_name: Optional[str] = setting(
        None, "Name of the W&B run (sd-scripts' --wandb_run_name); unset: W&B picks one.",
        advanced=True, label="W&B run name",
    )
    log_tracker_config: Optional[str] = setting(
        None, "A TOML file of tracker init arguments, one table per tracker ([wandb] tags, "
        "notes, entity...; [tensorboard] flush_secs...), passed to accelerate's init_trackers "
        "(sd-scripts' --log_tracker_config); its values win over the W&B run name and folder.",
        advanced=True, widget="file", label="Tracker arguments file",
    )
    full_fp16: bool = setting(
        False, "Keep the trained weights in fp16 too, with the loss scaler of fp16 mixed "
        "precision unscaling fp16 gradients (sd-scripts' --full_fp16); needs mixed_precision "
        "= 'fp16' and a CUDA / ROCm GPU.", advanced=True, label="Full fp16 weights",
    )
    ema_decay: Optional[float] = setting(
        None, "Keep an exponential moving average of the trained weights with this decay "
        "(0.999 is common; OneTrainer and SimpleTuner have it, sd-scripts does not); "
        "saving.use_ema_weights says whether files and samples use it. Unset: no EMA.",
        advanced=True, gt=0, lt=1, label="EMA decay",
    )
    ema_warmup: bool = setting(
        True, "Ramp the EMA decay up as 1 - n^(-2/3) at the n-th update, capped at ema_decay, "
        "so that the initial weights do not dominate the average (diffusers' EMAModel "
        "use_ema_warmup, as SimpleTuner uses it); off: ema_decay from the first update.",
        advanced=True, label="EMA warm-up",
    )
