"""What the advisor needs of Qwen-Image (:mod:`trainer.advisor.flow_memory`): the release its
shipped laws are made at, the text tokens of a step, the small models of the same width whose
steps it simulates (its one kind of block), a step's inputs on the meta device, and the parts of
its split files (:mod:`trainer.advisor.host_memory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VARIANT = "base"  # the release whose configs the advisor answers for
T5_TOKENS = 512  # the text tokens of a step: the pipeline's max_sequence_length (the most)
CLIP_TOKENS = 0
TRANSFORMER_PREFIX = "QwenImage"  # diffusers' QwenImageTransformer2DModel
TRAIN_BLOCKS = ("all",)  # network.train_blocks (FLUX.1's setting; one kind of block here)
SHAPES = [(1, 0), (2, 0)]  # the small models whose difference gives one block
FIXED_BLOCKS = 0  # every block is a swap unit


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-qwen-image``)."""
    from trainer.families.qwen_image.tiny import build_components

    return build_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    return dict(config, num_layers=blocks[0])


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per block, 0) from the values of :data:`SHAPES`."""
    block = values[1] - values[0]
    return values[0] - block, block, 0.0


def image_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The packed latents (2x2 patches of a ``w`` x ``h`` latent) and their grid."""
    tokens = (h // 2) * (w // 2)
    return dict(hidden_states=torch.zeros(batch, tokens, config["in_channels"], device="meta",
                                          dtype=torch.bfloat16),
                img_shapes=[[(1, h // 2, w // 2)]] * batch)


def step_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """Everything the transformer is called with in a step (no pooled text; no mask: every
    caption of the batch at the longest length)."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    return dict(image_inputs(config, w, h, batch, text),
                encoder_hidden_states=torch.zeros(batch, text, config["joint_attention_dim"],
                                                  **meta),
                timestep=torch.zeros(batch, **meta), return_dict=False)


def file_transformer_config(section: Any, path: Path) -> dict:
    """The transformer config the loader builds a Qwen-Image file with (model.config_dir's or
    the shipped one)."""
    import json

    from trainer.families.qwen_image.single_file import config_root

    root = config_root(section.config_dir, "transformer")
    return json.loads((root / "transformer" / "config.json").read_text(encoding="utf-8"))


def file_parts(section: Any, path: Path) -> dict[str, tuple[Path, str]]:
    """part -> (file, key prefix) of a Qwen-Image single file and its part files."""
    from trainer.families.qwen_image.layout import TEXT, VAE
    from trainer.families.qwen_image.single_file import file_info

    info = file_info(path)
    out: dict[str, tuple[Path, str]] = {}
    for part, setting, prefix in (("vae", section.vae, VAE),
                                  ("qwen25_7b", getattr(section, "text_encoder", None), TEXT)):
        if setting:
            out[part] = (Path(setting).expanduser(), _prefix_of(Path(setting), prefix))
        elif part in info.parts:
            out[part] = (path, prefix)
    return out


def _prefix_of(path: Path, prefix: str) -> str:
    """A part file's prefix: ComfyUI's all-in-one one where its keys have it, else none."""
    from trainer.families.common.files import read_safetensors_header

    try:
        keys = read_safetensors_header(path).tensors
    except Exception:  # noqa: BLE001 - an unreadable file counts as nothing here
        return prefix
    return prefix if any(k.startswith(prefix) for k in keys) else ""
