"""[training]: length, batch, precision, resume, compile and seed; the noise, loss, tracker
and EMA options are their own modules' (noise.py, loss.py, trackers.py, ema.py)."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import Section, setting
from trainer.config.sections.ema import TrainingEMA
from trainer.config.sections.loss import LossOptions
from trainer.config.sections.noise import NoiseOptions
from trainer.config.sections.trackers import Trackers


class TrainingCore(Section):
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
    full_fp16: bool = setting(
        False, "Keep the trained weights in fp16 too, with the loss scaler of fp16 mixed "
        "precision unscaling fp16 gradients (sd-scripts' --full_fp16); needs mixed_precision "
        "= 'fp16' and a CUDA / ROCm GPU.", advanced=True, label="Full fp16 weights",
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
    cpu_freed_memory: Literal["glibc", "reuse", "return"] = setting(
        "glibc", "CPU runs (glibc): what becomes of the large tensors a step frees. 'glibc': "
        "its own rule (they go back to the system, their pages mapped and zeroed anew every "
        "step). 'reuse': the next steps reuse them: a few percent faster steps, for a heap that "
        "keeps what it reached. 'return': every freed block over 128 KiB goes back at once: "
        "the lowest peak memory (about 10% lower on the README's CPU bench), for about 8% "
        "slower steps (README 'Speed').",
        advanced=True, label="CPU: freed memory",
    )
    seed: int = setting(42, "Random seed.", ge=0, le=2**32 - 1, label="Seed")


class TrainingSection(TrainingEMA, Trackers, LossOptions, NoiseOptions, TrainingCore):
    """[training]: the core fields, then the noise, loss, tracker and EMA options, then
    these."""

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
