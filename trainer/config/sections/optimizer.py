"""[optimizer]: the optimizer, its learning rates and schedule."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from trainer.config.sections.base import SECOND_CLIP, Section, setting

OptimizerName = Literal[
    "AdamW", "AdamW8bit", "PagedAdamW8bit", "PagedAdamW", "PagedAdamW32bit", "Lion", "Lion8bit",
    "PagedLion8bit", "SGDNesterov", "SGDNesterov8bit", "Adafactor", "Prodigy", "DAdaptAdam",
    "DAdaptation", "DAdaptAdamPreprint", "DAdaptAdaGrad", "DAdaptAdan", "DAdaptAdanIP",
    "DAdaptLion", "DAdaptSGD", "AdamWScheduleFree", "RAdamScheduleFree", "SGDScheduleFree",
]
SchedulerName = Literal[
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
    "cosine_with_min_lr", "inverse_sqrt", "warmup_stable_decay", "piecewise_constant", "adafactor",
]


class OptimizerSection(Section):
    optimizer_type: OptimizerName = setting("AdamW", "Optimizer.", label="Optimizer")
    optimizer_class: Optional[str] = setting(
        None, "An optimizer by import path instead of optimizer_type, as sd-scripts' "
        "--optimizer_type takes it: 'module.Class' (e.g. 'pytorch_optimizer.CAME'), a bare "
        "name is a class of torch.optim; it gets the learning rates, weight_decay and "
        "optimizer_args.", advanced=True,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        label="Optimizer class (import path)",
    )
    learning_rate: float = setting(1e-4, "Base learning rate.", gt=0, le=10, label="Learning rate")
    unet_lr: Optional[float] = setting(
        None, "Learning rate of the UNet; unset uses learning_rate.", modes=("lora", "dreambooth"),
        advanced=True, gt=0, le=10,
        label="UNet learning rate",
    )
    text_encoder_lr: Optional[float] = setting(
        None, "Learning rate of the text encoder; unset uses learning_rate.",
        modes=("lora", "dreambooth"), advanced=True, gt=0, le=10,
        label="Text-encoder learning rate",
    )
    text_encoder_2_lr: Optional[float] = setting(
        None, "SDXL only: learning rate of the second text encoder; unset uses "
        "text_encoder_lr.", modes=("lora", "dreambooth"), advanced=True, gt=0, le=10,
        label="Second text-encoder learning rate",
        families=SECOND_CLIP,
    )
    block_lr: Optional[list[Annotated[float, Field(ge=0, le=10)]]] = setting(
        None, "SDXL DreamBooth: a learning rate for each of the UNet's 23 blocks as sd-scripts' "
        "sdxl_train.py --block_lr counts them (0: time and size embeddings; 1-9: input "
        "blocks; 10-12: middle block; 13-21: output blocks; 22: the output layer), instead of "
        "unet_lr; a block at 0 does not train.", modes=("dreambooth",), advanced=True,
        min_length=23, max_length=23, families=("sdxl",), label="UNet block learning rates",
    )
    weight_decay: float = setting(
        0.01, "Weight decay (sd-scripts takes any value; the decay per step is weight_decay x "
        "the learning rate).", advanced=True, ge=0, le=100, label="Weight decay")
    optimizer_args: dict[str, Union[bool, int, float, str, list[float]]] = setting(
        {}, "Extra keyword arguments for the optimizer, e.g. {d_coef = 2.0} for Prodigy, "
        "{betas = [0.9, 0.99]}.",
        advanced=True, widget="dict",
        label="Optimizer arguments",
    )
    lr_scheduler: SchedulerName = setting("constant", "Learning-rate schedule.",
                                          label="Learning-rate schedule")
    lr_warmup_steps: int = setting(0, "Warm-up steps at the start of the schedule.", ge=0,
                                   label="Learning-rate warm-up steps")
    lr_warmup_ratio: Optional[float] = setting(
        None, "Warm-up as a fraction of the run's steps, instead of lr_warmup_steps "
        "(sd-scripts' --lr_warmup_steps given as a float < 1; kohya_ss's warm-up %).",
        advanced=True, gt=0, lt=1,
        label="Learning-rate warm-up fraction",
    )
    lr_scheduler_num_cycles: int = setting(
        1, "Restarts of cosine_with_restarts.", advanced=True, ge=1, le=1000,
        label="Cosine restarts",
    )
    lr_scheduler_power: float = setting(
        1.0, "Power of the polynomial schedule.", advanced=True, gt=0, le=100,
        label="Polynomial power",
    )
    lr_scheduler_args: dict[str, Union[bool, int, float, str, list[Union[int, float]]]] = \
        setting(
        {}, "Extra keyword arguments for the schedule (sd-scripts' lr_scheduler_args), e.g. "
        "{min_lr_rate = 0.1} for cosine_with_min_lr, {num_decay_steps = 100} for "
        "warmup_stable_decay, {step_rules = '1:100,0.1'} for piecewise_constant; with "
        "lr_scheduler_type, that class's arguments ({step_size = 100, gamma = 0.5}).",
        advanced=True, widget="dict", label="Schedule arguments",
    )
    lr_scheduler_type: Optional[str] = setting(
        None, "A class of torch.optim.lr_scheduler (StepLR, OneCycleLR, ...) or 'module.Class' "
        "as the schedule instead of lr_scheduler, with lr_scheduler_args as its arguments "
        "(sd-scripts' --lr_scheduler_type); checked when the config loads.", advanced=True,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        label="Custom schedule class",
    )
    fused_backward_pass: bool = setting(
        False, "DreamBooth: step the optimizer on each parameter as soon as its gradient is "
        "computed, during the backward pass, and free that gradient (sd-scripts' "
        "--fused_backward_pass): the whole model's gradients are never in memory at once. "
        "Same weights as the normal step; needs gradient accumulation 1, one process and no "
        "fp16 loss scaler; max_grad_norm then clips each parameter's gradient on its own, as "
        "in sd-scripts.", modes=("dreambooth",), advanced=True, label="Fused backward pass",
    )
    fused_optimizer_groups: Optional[int] = setting(
        None, "DreamBooth: as fused_backward_pass, but the trained parameters are cut into "
        "this many groups (a new one where the learning rate changes), each stepped once its "
        "last gradient is in (sd-scripts' sdxl_train.py --fused_optimizer_groups).",
        modes=("dreambooth",), advanced=True, ge=1, le=10000, label="Fused optimizer groups",
    )
    max_grad_norm: float = setting(
        1.0, "Clip gradients to this norm; 0 turns clipping off (as in sd-scripts).", ge=0,
        label="Gradient clipping norm",
    )
