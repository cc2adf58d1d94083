"""[training] options of the noise that the model learns to remove (DDPM families; the math
is trainer/objectives/losses.py): offsets, multi-resolution and input-perturbation noise, zero
terminal SNR and the timestep range."""

from __future__ import annotations

from typing import Optional

from trainer.config.sections.base import DDPM, Section, setting


class NoiseOptions(Section):
    """The noise options, mixed into :class:`trainer.config.sections.training.TrainingSection`."""

    zero_terminal_snr: bool = setting(
        False, "Rescale the noise schedule to zero terminal SNR (Lin et al. 2024); for "
        "v-prediction models. Samples use the same schedule.", advanced=True,
        label="Zero terminal SNR",
        families=DDPM,
    )
    noise_offset: Optional[float] = setting(
        None, "Noise offset (Guttenberg 2023): lets the model learn darker and brighter images.",
        advanced=True, ge=0, le=1,
        label="Noise offset",
        families=DDPM,
    )
    noise_offset_random_strength: bool = setting(
        False, "Draw the noise offset's strength uniformly between 0 and noise_offset for "
        "every batch (sd-scripts' option of the same name).", advanced=True,
        label="Random noise-offset strength",
        families=DDPM,
    )
    adaptive_noise_scale: Optional[float] = setting(
        None, "Add this times the absolute mean of each latent channel to the noise offset "
        "(needs noise_offset; sd-scripts' option of the same name).", advanced=True,
        ge=-1, le=1,
        label="Adaptive noise scale",
        families=DDPM,
    )
    multires_noise_iterations: Optional[int] = setting(
        None, "Multi-resolution (pyramid) noise with this many levels (6-10 is usual; "
        "Whitaker 2023); unset: plain Gaussian noise.", advanced=True, ge=1, le=64,
        label="Multires noise iterations",
        families=DDPM,
    )
    multires_noise_discount: float = setting(
        0.3, "Weight decay per level of the multires noise (only with "
        "multires_noise_iterations).", advanced=True, ge=0, le=1,
        label="Multires noise discount",
        families=DDPM,
    )
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
    min_timestep: Optional[int] = setting(
        None, "Draw training timesteps from this one up (unset: 0).", advanced=True,
        ge=0, le=999,
        label="Minimum timestep",
        families=DDPM,
    )
    max_timestep: Optional[int] = setting(
        None, "Draw training timesteps below this one (exclusive; unset: the schedule's "
        "length, 1000).", advanced=True, ge=1, le=1000,
        label="Maximum timestep",
        families=DDPM,
    )
