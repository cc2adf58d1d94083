"""[network]: the adapter (LoRA, LyCORIS) and what it trains."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import BLOCKS, SECOND_CLIP, T5, UNET, Section, setting
from trainer.config.sections.lora import LoraOptions
from trainer.config.sections.network_lycoris import NetworkLycoris

NetworkType = Literal["lora", "locon", "loha", "lokr", "ia3", "dora", "glora", "boft",
                      "diag-oft"]


class NetworkCore(Section):
    network_type: NetworkType = setting(
        "lora", "Adapter: lora (peft LoRA, + conv_dim for LoCon); locon, loha, lokr, ia3, "
        "dora (LoRA with weight decomposition), glora (generalized LoRA), boft (butterfly "
        "OFT) or diag-oft (block-diagonal OFT; network_dim bounds their block size) through the "
        "lycoris-lora package "
        "(network_module lycoris.kohya); ia3 has no rank and ignores network_dim/alpha.",
        modes=("lora",), label="Network type",
    )
    train_blocks: Literal["all", "single", "double", "with_refiners"] = setting(
        "all", "The transformer blocks that get LoRA. FLUX.1 / FLUX.2 / Chroma: all, only the "
        "single-stream or only the double-stream blocks (sd-scripts' network_args "
        "train_blocks). Z-Image: all = its main layers (as musubi-tuner and ai-toolkit), "
        "with_refiners = those and the noise and context refiners (as diffusers' example).",
        modes=("lora",), advanced=True, families=BLOCKS,
        label="Blocks (FLUX.1 / FLUX.2 / Chroma / Z-Image)")
    train_t5xxl: bool = setting(
        False, "FLUX.1 / SD 3.5: also train a LoRA on T5-XXL (with the text-encoder learning "
        "rate; needs network.train_text_encoder); its outputs then cannot be cached.",
        modes=("lora",), advanced=True, families=T5, label="Train T5-XXL")
    network_dim: int = setting(8, "LoRA rank.", modes=("lora",), ge=1, le=1024,
                               label="Network rank (dim)")
    network_alpha: float = setting(
        4.0, "LoRA alpha; the update is scaled by alpha / rank.", modes=("lora",), gt=0, le=4096,
        label="Network alpha",
    )
    network_dropout: Optional[float] = setting(
        None, "Dropout on the LoRA path.", modes=("lora",), advanced=True, ge=0, lt=1,
        label="Network dropout",
    )
    conv_dim: Optional[int] = setting(
        None, "Rank of LoRA on the 3x3 convolutions too (LoCon); unset: attention only for "
        "lora, network_dim for the LyCORIS types (as lycoris does).",
        modes=("lora",), advanced=True, ge=1, le=1024, families=UNET,
        label="Convolution rank (LoCon)",
    )
    conv_alpha: Optional[float] = setting(
        None, "Alpha of the convolution LoRA; unset uses conv_dim (LyCORIS: network_alpha).",
        modes=("lora",), advanced=True, gt=0, le=4096, families=UNET,
        label="Convolution alpha",
    )
    factor: Optional[int] = setting(
        None, "LoKr only: the Kronecker factor of each dimension; unset: lycoris picks it "
        "(its factor -1).", modes=("lora",), advanced=True, ge=1, le=4096, label="LoKr factor",
    )
    decompose_both: bool = setting(
        False, "LoKr only: factor the smaller Kronecker matrix into low rank too.",
        modes=("lora",), advanced=True, label="LoKr: decompose both",
    )
    use_tucker: bool = setting(
        False, "LyCORIS locon/loha/lokr/dora: Tucker (CP) decomposition of the 3x3 "
        "convolutions' kernels.", modes=("lora",), advanced=True, label="Tucker decomposition",
    )
    use_scalar: bool = setting(
        False, "LyCORIS locon/loha/lokr/dora: a trained scalar on the update (starts at 0).",
        modes=("lora",), advanced=True, label="Trained scalar",
    )
    rank_dropout: Optional[float] = setting(
        None, "Dropout of ranks of the update, per sample (sd-scripts' rank_dropout; lora, "
        "locon, loha, lokr, dora).",
        modes=("lora",), advanced=True, ge=0, lt=1, label="Rank dropout",
    )
    module_dropout: Optional[float] = setting(
        None, "Probability of skipping a module's adapter in a step (sd-scripts' "
        "module_dropout; every type).",
        modes=("lora",), advanced=True, ge=0, lt=1, label="Module dropout",
    )
    train_norm: bool = setting(
        False, "LyCORIS types: train the norm layers' weights and biases too.",
        modes=("lora",), advanced=True, label="Train norm layers",
    )
    train_unet: bool = setting(True, "Train the UNet.", modes=("lora", "dreambooth"),
                               label="Train the UNet")
    train_text_encoder: bool = setting(
        False, "Train the text encoder too.", modes=("lora", "dreambooth"),
        label="Train the text encoder",
    )
    train_text_encoder_2: Optional[bool] = setting(
        None, "SDXL only: train the second text encoder (OpenCLIP bigG); unset follows "
        "train_text_encoder.", modes=("lora", "dreambooth"), advanced=True,
        label="Train SDXL's second text encoder",
        families=SECOND_CLIP,
    )
    stop_text_encoder_training: Optional[int] = setting(
        None, "Freeze the text encoder after this many steps (it trains until then).",
        modes=("lora", "dreambooth"), advanced=True, ge=1,
        label="Stop text-encoder training after (steps)",
    )
    token_string: Optional[str] = setting(
        None, "The new token that the embedding learns, e.g. <my-cat>.",
        modes=("textual_inversion",),
        label="Token",
    )
    init_word: Optional[str] = setting(
        None, "Word(s) whose embedding starts the token; with several tokens, vector i starts "
        "from token i (repeated when there are fewer); unset starts from their mean.",
        modes=("textual_inversion",),
        label="Initial word(s)",
    )
    num_vectors_per_token: int = setting(
        1, "Number of embedding vectors for the token.", modes=("textual_inversion",),
        ge=1, le=75,
        label="Vectors per token",
    )
    caption_templates: Optional[Literal["object", "style"]] = setting(
        None, "Train on built-in captions ('a photo of a <token>', ... or 'a painting in the "
        "style of <token>', ...) instead of the dataset's; unset: every caption must hold "
        "the token.", modes=("textual_inversion",),
        label="Built-in caption templates",
    )
    embedding_weights: Optional[str] = setting(
        None, "Start the token's vectors from this embedding file instead of init_word "
        "(sd-scripts' --weights, kohya_ss's 'Resume TI training'): .safetensors, or a .pt / "
        ".bin of tensors (AUTOMATIC1111's, diffusers'); SDXL files hold clip_l and clip_g. "
        "Its vectors must number num_vectors_per_token.", modes=("textual_inversion",),
        advanced=True, widget="file", label="Start from an embedding file",
    )



class NetworkSection(NetworkLycoris, LoraOptions, NetworkCore):
    """[network]: the fields above, then sd-scripts' further LoRA options (lora.py)."""


# sd-scripts' --optimizer_type spellings; trainer/optim/optimizers.py builds each.
