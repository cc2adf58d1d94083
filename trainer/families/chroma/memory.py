"""What the advisor needs of Chroma (:mod:`trainer.advisor.flow_memory`): the release its shipped
laws are made at, the text tokens of a step (T5's 512 at most: a caption's real tokens and one
padding token reach the transformer, so the laws answer for the longest caption), the small
models of the same width whose steps it simulates (double and single blocks; the approximator is
in the fixed part) and a step's inputs on the meta device (no pooled text, no guidance)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.families.chroma import CHROMA

VARIANT = "hd"  # the release whose configs and T5 length the advisor answers for
T5_TOKENS = CHROMA.variant(VARIANT).t5_length  # 512
CLIP_TOKENS = 0  # no CLIP
TRANSFORMER_PREFIX = "Chroma"  # diffusers' ChromaTransformer2DModel
TRAIN_BLOCKS = ("all", "single", "double")  # network.train_blocks
# the small models (double, single blocks) whose differences give one block of each kind
SHAPES = [(1, 1), (2, 1), (1, 2)]
FIXED_BLOCKS = 0  # every block is a swap unit
POOLED = False  # the transformer reads no pooled text embedding


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-chroma``)."""
    from trainer.families.chroma.tiny import build_chroma_components

    return build_chroma_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    """The config with ``blocks`` (double, single) blocks."""
    return dict(config, num_layers=blocks[0], num_single_layers=blocks[1])


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per double block, per single block) from the values of :data:`SHAPES`."""
    double, single = values[1] - values[0], values[2] - values[0]
    return values[0] - double - single, double, single


def image_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The transformer's inputs beside the text's: the packed latents (2x2 patches of a
    ``w`` x ``h`` latent) and their and the text's position ids."""
    tokens = (h // 2) * (w // 2)
    return dict(hidden_states=torch.zeros(batch, tokens, config["in_channels"], device="meta",
                                          dtype=torch.bfloat16),
                img_ids=torch.zeros(tokens, 3, device="meta"),
                txt_ids=torch.zeros(text, 3, device="meta"))
