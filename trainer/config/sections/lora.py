"""[network], continued: sd-scripts' LoRA network options beyond the rank (LoRA+, block-wise
rates and ranks, continuing from a file, max-norm), mixed into
:class:`trainer.config.sections.network.NetworkSection`."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field, field_validator, model_validator

from trainer.config.sections.base import UNET, Section, setting

Dim = Annotated[int, Field(ge=0, le=1024)]
Alpha = Annotated[float, Field(gt=0, le=4096)]


def _lora_setting(default, help: str, label: str, families=None, **bounds):
    return setting(default, help, modes=("lora",), advanced=True, label=label,
                   families=families, **bounds)


class LoraOptions(Section):
    loraplus_lr_ratio: Optional[float] = _lora_setting(
        None, "LoRA+ (Hayou et al. 2024, sd-scripts' loraplus_lr_ratio): the B (lora_up) "
        "matrices learn at this many times the rate of the A matrices; 16 is the paper's "
        "advice. network_type = 'lora' only.", "LoRA+ ratio", gt=0, le=1000)
    loraplus_unet_lr_ratio: Optional[float] = _lora_setting(
        None, "LoRA+ ratio for the UNet / transformer only (wins over loraplus_lr_ratio).",
        "LoRA+ ratio (UNet)", gt=0, le=1000)
    loraplus_text_encoder_lr_ratio: Optional[float] = _lora_setting(
        None, "LoRA+ ratio for the text encoders only (wins over loraplus_lr_ratio).",
        "LoRA+ ratio (text encoder)", gt=0, le=1000)
    down_lr_weight: Optional[str] = _lora_setting(
        None, "SD families, block-wise learning rate of the UNet's down blocks (12; SDXL 9), "
        "shallow to deep: '1,1,0.5,...' or a shape cosine, sine, linear, reverse_linear, "
        "zeros with an optional +N (sd-scripts' down_lr_weight). A block at weight 0 gets no "
        "LoRA.", "Down blocks' lr weights", UNET)
    mid_lr_weight: Optional[str] = _lora_setting(
        None, "SD families: lr weight of the middle block (SDXL: 3, comma-separated).",
        "Middle block lr weight", UNET)
    up_lr_weight: Optional[str] = _lora_setting(
        None, "SD families: lr weights of the up blocks (12; SDXL 9), deep to shallow, as "
        "down_lr_weight.", "Up blocks' lr weights", UNET)
    block_lr_zero_threshold: Optional[float] = _lora_setting(
        None, "SD families: block lr weights at or below this become 0 (no LoRA in that "
        "block); unset: 0.", "Block lr zero threshold", UNET, ge=0)
    block_dims: Optional[list[Dim]] = _lora_setting(
        None, "SD families: the LoRA rank of each UNet block (25 for SD 1.x/2.x, 23 for SDXL, "
        "as sd-scripts counts them); 0 leaves a block out.", "Block ranks", UNET)
    block_alphas: Optional[list[Alpha]] = _lora_setting(
        None, "SD families: the alpha of each block (with block_dims or lr weights); unset: "
        "network_alpha.", "Block alphas", UNET)
    conv_block_dims: Optional[list[Dim]] = _lora_setting(
        None, "SD families: the 3x3-convolution rank of each block (LoCon), with block_dims "
        "or lr weights; unset: conv_dim.", "Block conv ranks", UNET)
    conv_block_alphas: Optional[list[Alpha]] = _lora_setting(
        None, "SD families: the convolution alpha of each block; unset: conv_alpha (unset: "
        "the block's conv rank).", "Block conv alphas", UNET)
    network_weights: Optional[str] = setting(
        None, "Continue from this LoRA or LyCORIS file (kohya names, ours or anyone's): its "
        "weights are loaded into the network before step 1 (sd-scripts' network_weights). Its "
        "ranks must match network_dim / conv_dim unless dim_from_weights. FLUX.1 / SD 3.5 "
        "(transformer families): LyCORIS types only, from a file of ours.", modes=("lora",),
        advanced=True, widget="file", label="Start from network weights")
    dim_from_weights: bool = _lora_setting(
        False, "Take each module's rank and alpha from network_weights (network_dim / "
        "network_alpha / conv_dim are then the file's).", "Ranks from the weights file", UNET)
    scale_weight_norms: Optional[float] = _lora_setting(
        None, "Max-norm regularization (sd-scripts' scale_weight_norms): after each step, a "
        "LoRA module whose update (up @ down * alpha/rank) has a norm above this is scaled "
        "down to it; the number of scaled modules is logged. 1 is a common value.",
        "Max norm of each module", gt=0)
    dylora_unit: Optional[int] = _lora_setting(
        None, "DyLoRA (Valipour et al. 2022, sd-scripts' networks.dylora network_args unit): "
        "each step every module trains one block of this many ranks, picked at random, so the "
        "file (a plain LoRA at network_dim) can be cut to any multiple of it; network_dim must "
        "be a multiple. Unset: plain LoRA.", "DyLoRA unit", UNET, ge=1, le=1024)

    @field_validator("down_lr_weight", "mid_lr_weight", "up_lr_weight")
    @classmethod
    def _weights(cls, value: Optional[str], info) -> Optional[str]:
        from trainer.config.lora_blocks import parse_weights

        if value is not None:
            parse_weights(value, 12, named=info.field_name != "mid_lr_weight")
        return value

    @model_validator(mode="after")
    def _combinations(self):
        from trainer.config.rules.network import network_extra_problems

        problems = network_extra_problems(self, None)
        if problems:
            raise ValueError(problems[0])
        return self
