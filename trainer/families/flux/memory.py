"""What the advisor needs of FLUX.1 (:mod:`trainer.advisor.flow_memory`): the release its shipped
laws are made at, the text tokens of a step, the small models of the same width whose steps it
simulates (double and single blocks) and a step's inputs on the meta device."""

from __future__ import annotations

from typing import Any

import torch

from trainer.families.flux import FLUX1

VARIANT = "dev"  # the release whose configs and T5 length the advisor answers for
T5_TOKENS = FLUX1.variant(VARIANT).t5_length  # 512
CLIP_TOKENS = 0  # CLIP-L gives only its pooled output
TRANSFORMER_PREFIX = "Flux"  # diffusers' FluxTransformer2DModel
TRAIN_BLOCKS = ("all", "single", "double")  # network.train_blocks
# the small models (double, single blocks) whose differences give one block of each kind
SHAPES = [(1, 1), (2, 1), (1, 2)]
FIXED_BLOCKS = 0  # every block is a swap unit


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-flux``)."""
    from trainer.families.common.tiny_mmdit import build_flux_components

    return build_flux_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    """The config with ``blocks`` (double, single) blocks."""
    return dict(config, num_layers=blocks[0], num_single_layers=blocks[1])


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per double block, per single block) from the values of :data:`SHAPES`."""
    double, single = values[1] - values[0], values[2] - values[0]
    return values[0] - double - single, double, single


def image_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The transformer's inputs beside the text's: the packed latents (2x2 patches of a
    ``w`` x ``h`` latent), their and the text's position ids, the guidance of FLUX.1-dev."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    tokens = (h // 2) * (w // 2)
    extra = {"guidance": torch.zeros(batch, **meta)} if config.get("guidance_embeds") else {}
    return dict(hidden_states=torch.zeros(batch, tokens, config["in_channels"], **meta),
                img_ids=torch.zeros(tokens, 3, device="meta"),
                txt_ids=torch.zeros(text, 3, device="meta"), **extra)
