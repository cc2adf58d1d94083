"""What the advisor needs of Z-Image (:mod:`trainer.advisor.flow_memory`): the release its laws
are made at, the text tokens of a step, the small models of the same width whose steps it
simulates (main layers; the refiners are part of the fixed share) and a step's inputs on the
meta device."""

from __future__ import annotations

from typing import Any

import torch

from trainer.families.zimage import ZIMAGE

VARIANT = "turbo"  # the release whose configs the advisor answers for
T5_TOKENS = ZIMAGE.variant(VARIANT).t5_length  # None: no T5
CLIP_TOKENS = 0
TEXT_TOKENS = 128  # a caption's Qwen3 tokens in a step (its own length, padded to 32 by the DiT)
TRANSFORMER_PREFIX = "ZImage"  # diffusers' ZImageTransformer2DModel
TRAIN_BLOCKS = ("all",)  # the LoRA's blocks: the main layers (trainer/families/zimage/lora.py)
# main layers of the small models: two and three (with checkpointing a step's peak grows by
# the same amount with each main layer from the second on; the first costs more)
SHAPES = [(2, 0), (3, 0)]
FIXED_BLOCKS = 0  # every main layer is a swap unit (trainer/models/block_swap.py)


def file_transformer_config(section: Any, path: Any) -> dict:
    """The transformer config a Z-Image single file loads with (its header's widths and depths
    over ``model.config_dir``'s or the shipped config), as the loader builds it."""
    from pathlib import Path

    from trainer.families.common.files import read_safetensors_header
    from trainer.families.zimage.detect import header_info, variant_of
    from trainer.families.zimage.single_file import transformer_config

    info = header_info(read_safetensors_header(path).tensors)
    root = Path(section.config_dir).expanduser() if section.config_dir else \
        ZIMAGE.assets(variant_of(Path(path)))
    return dict(transformer_config(info, root), _class_name="ZImageTransformer2DModel")


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-zimage``)."""
    from trainer.families.zimage.tiny import build_zimage_components

    return build_zimage_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    """The config with ``blocks[0]`` main layers (``num_layers`` too: the advisor's count)."""
    return dict(config, n_layers=blocks[0], num_layers=blocks[0])


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per main layer, 0) from the values of :data:`SHAPES`."""
    per_layer = values[1] - values[0]
    return values[0] - 2 * per_layer, per_layer, 0.0


def block_counts(config: dict) -> tuple[int, int]:
    """The swap units: the main layers (the advisor's (first kind, second kind))."""
    return config.get("num_layers", config["n_layers"]), 0


def text_width(config: dict) -> int:
    """The width of the text features a step holds (the cached Qwen3 hidden states)."""
    return config["cap_feat_dim"]


def step_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The transformer's inputs of a step: one [C, 1, h, w] latent and one caption of
    ``text`` tokens per image, the timesteps."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    return dict(x=[torch.zeros(config["in_channels"], 1, h, w, **meta) for _ in range(batch)],
                cap_feats=[torch.zeros(text, config["cap_feat_dim"], **meta)
                           for _ in range(batch)],
                t=torch.zeros(batch, **meta))
