"""What the advisor needs of FLUX.2 (:mod:`trainer.advisor.flow_memory`): the release its laws
would be made at, the text tokens of a step, the small models of the same width whose steps it
simulates (double and single blocks) and a step's inputs on the meta device.

FLUX.2 has no T5 and no pooled text: its text is the 512 stacked Qwen3 tokens
(:data:`TEXT_TOKENS`); the advisor's flow simulation still hands every flow transformer FLUX.1's
pooled projection, which ``Flux2Transformer2DModel`` does not take, so no laws are made or
shipped for FLUX.2 yet."""

from __future__ import annotations

from typing import Any

import torch

VARIANT = "klein-4b"  # the release whose configs the advisor answers for
T5_TOKENS = None  # no T5 (the spec's variants have no t5_length)
CLIP_TOKENS = 0
TEXT_TOKENS = 512  # Qwen3 tokens per caption (Flux2KleinPipeline's max_sequence_length)
TRANSFORMER_PREFIX = "Flux2"  # diffusers' Flux2Transformer2DModel
TRAIN_BLOCKS = ("all", "single", "double")  # network.train_blocks
# the small models (double, single blocks) whose differences give one block of each kind
SHAPES = [(1, 1), (2, 1), (1, 2)]
FIXED_BLOCKS = 0  # every block is a swap unit
# what the advisor says instead of an estimate (trainer/advisor/estimate.py)
NOT_ADVISED = ("no memory estimate for FLUX.2 yet: the advisor's flow simulation hands every "
               "transformer FLUX.1's pooled text, which FLUX.2 does not read; the presets "
               "flux2-klein-4b-16gb.toml / -24gb.toml give a starting point")


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-flux2``)."""
    from trainer.families.flux2.tiny import build_flux2_components

    return build_flux2_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    """The config with ``blocks`` (double, single) blocks."""
    return dict(config, num_layers=blocks[0], num_single_layers=blocks[1])


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per double block, per single block) from the values of :data:`SHAPES`."""
    double, single = values[1] - values[0], values[2] - values[0]
    return values[0] - double - single, double, single


def image_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The transformer's inputs beside the text's: the patchified, packed latents of a ``w`` x
    ``h`` latent (one token per 2x2 patch), their and the text's 4-axis position ids."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    tokens = (h // 2) * (w // 2)
    extra = {"guidance": torch.zeros(batch, **meta)} if config.get("guidance_embeds") else {}
    return dict(hidden_states=torch.zeros(batch, tokens, config["in_channels"], **meta),
                img_ids=torch.zeros(batch, tokens, 4, device="meta"),
                txt_ids=torch.zeros(batch, text, 4, device="meta"), **extra)
