"""What the advisor needs of SD 3.5 (:mod:`trainer.advisor.flow_memory`): the release its shipped
laws are made at, the text tokens of a step (CLIP's 77 before T5's), the small models of the
same width whose steps it simulates (joint blocks) and a step's inputs on the meta device."""

from __future__ import annotations

from typing import Any

import torch

from trainer.families.sd3 import SD3

VARIANT = "5-large"  # the release whose configs and T5 length the advisor answers for
T5_TOKENS = SD3.variant(VARIANT).t5_length  # 256
CLIP_TOKENS = 77  # CLIP-L's and CLIP-G's hidden states, before T5's
TRANSFORMER_PREFIX = "SD3"  # diffusers' SD3Transformer2DModel
TRAIN_BLOCKS = ("all",)  # network.train_blocks
# the small models (joint blocks, 0) whose difference gives one block (the last block,
# context-pre-only, is in every one of them)
SHAPES = [(2, 0), (3, 0)]
FIXED_BLOCKS = 1  # the last, context-pre-only block is in the fixed part, not a swap unit


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-sd3``)."""
    from trainer.families.common.tiny_mmdit import build_sd3_components

    return build_sd3_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    """The config with ``blocks[0]`` joint blocks (SD 3.5 medium's dual-attention ones among
    the first of them)."""
    dual = config.get("dual_attention_layers") or []
    return dict(config, num_layers=blocks[0],
                dual_attention_layers=list(range(min(len(dual), blocks[0] - 1))))


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per joint block, 0) from the values of :data:`SHAPES`."""
    joint = values[1] - values[0]
    return values[0] - 2 * joint, joint, 0.0


def image_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The transformer's latent input (``w`` x ``h``, patched inside the model)."""
    return dict(hidden_states=torch.zeros(batch, config["in_channels"], h, w, device="meta",
                                          dtype=torch.bfloat16))
