"""[training]: length, batch, precision, noise and loss."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import DDPM, setting
from trainer.config.sections.training_parity import TrainingParity


class TrainingSection(TrainingParity):
    max_train_epochs: Optional[int] = setting(
        None, "Train this many epochs; with neither this nor max_train_steps set, one epoch.",
        ge=1, le=100000,
        label="Epochs",
    )
    max_train_steps: Optional[int] = setting(
        None, "Train this many optimizer steps; when both are set the first reached wins.",
        ge=1, le=10_000_000,
        label="Maximum steps",
    )
    train_batch_size: int = setting(1, "Images per batch.", ge=1, le=1024, label="Batch size")
    gradient_accumulation_steps: int = setting(
        1, "Batches summed into one optimizer step.", advanced=True, ge=1, le=1024,
        label="Gradient accumulation steps",
    )
    num_processes: int = setting(
        1, "Training processes on this machine (DDP through accelerate, one per GPU; gloo on "
        "the CPU). Each trains batch size images per step: the global batch is batch size x "
        "processes (x machines).", advanced=True, ge=1, le=64,
        label="Processes (GPUs)",
    )
    distributed: Literal["ddp", "fsdp"] = setting(
        "ddp", "How the processes of a multi-process run share the model. ddp: every GPU "
        "holds the whole model, its gradients and optimizer state; the gradients are "
        "averaged. fsdp: the trained UNet / transformer (and trained text encoders) is fully "
        "sharded with PyTorch FSDP2, each GPU holding 1/N of the weights, gradients and "
        "optimizer state and gathering one block at a time: a full fine-tune that does not "
        "fit one GPU. DreamBooth with more than one process; AdamW, Lion, SGDNesterov or a "
        "schedule-free optimizer.", advanced=True, modes=("dreambooth",),
        label="Multi-GPU strategy",
    )
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = setting(
        "auto", "Compute precision; auto picks what the device does best.",
        label="Mixed precision",
    )
    full_bf16: bool = setting(
        False, "Keep the trained weights in bf16 too (saves memory; needs bf16 precision).",
        advanced=True,
        label="Full bf16 weights",
    )
    resume: Optional[str] = setting(
        None, "Continue from a saved state: its folder, or 'latest' for the newest complete "
        "state in saving.output_dir.", widget="dir",
        label="Resume from a saved state",
    )
    gradient_checkpointing: bool = setting(
        False, "Recompute activations in the backward pass to save memory.", advanced=True,
        label="Gradient checkpointing",
    )
    compile: Optional[bool] = setting(
        None, "Compile the UNet with torch.compile: the first steps wait for the compiler "
        "(minutes for a full-size model), the later ones may run faster. Unset: off on every "
        "backend (see bench/compile_speed.py for this machine's figures).", advanced=True,
        label="Compile the UNet (torch.compile)",
    )
    compile_scope: Literal["model", "regional"] = setting(
        "model", "What training.compile compiles: the whole UNet / transformer, or 'regional': "
        "one of each repeated block (the transformer blocks), reused for every copy, the rest "
        "eager; it compiles in a fraction of the time and pays after fewer steps (README "
        "'Speed').", advanced=True,
        label="Compile scope",
    )
    seed: int = setting(42, "Random seed.", ge=0, le=2**32 - 1, label="Seed")
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
    min_snr_gamma: Optional[float] = setting(
        None, "Min-SNR loss weighting gamma (Hang et al. 2023); 5 is the paper's value.",
        advanced=True, gt=0, le=100,
        label="Min-SNR gamma",
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
    log_with: Literal["none", "tensorboard", "wandb", "all"] = setting(
        "tensorboard", "Where the training logs go, under logging_dir: TensorBoard, Weights & "
        "Biases (wandb; WANDB_MODE=offline works without an account) or all (both), as "
        "sd-scripts' --log_with.", advanced=True,
        label="Logging",
    )
    logging_dir: Optional[str] = setting(
        None, "Folder of the TensorBoard logs; unset uses logs inside output_dir.",
        advanced=True, widget="dir",
        label="Log folder",
    )
    validate_every_n_steps: Optional[int] = setting(
        None, "Measure the validation loss every N steps (at fixed timesteps and noise, so the "
        "values compare); unset: at the end of every epoch.", advanced=True, ge=1,
        label="Validate every N steps",
    )
    blocks_to_swap: Optional[int] = setting(
        None, "Keep this many of the transformer's (or UNet's) blocks in host memory and move "
        "each to the device just before it runs and back after (a side stream overlaps the "
        "copies with compute on CUDA): less device memory, slower steps. Needs gradient "
        "checkpointing; LoRA and textual inversion (sd-scripts' --blocks_to_swap).",
        advanced=True, ge=1, le=64, modes=("lora", "textual_inversion"),
        label="Blocks to swap")
