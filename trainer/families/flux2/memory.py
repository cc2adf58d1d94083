"""What the advisor needs of FLUX.2 (:mod:`trainer.advisor.flow_memory`): the release its laws
are made at, the text tokens of a step, the small models of the same width whose steps it
simulates (double and single blocks), a step's inputs on the meta device, the transformer
config a single file loads with and where its parts are (:mod:`trainer.advisor.host_memory`).

FLUX.2 has no T5 and no pooled text: its text is the 512 stacked hidden states of its encoder
(Qwen3 for klein, Mistral-Small-3 for dev; :data:`TEXT_TOKENS`), with 4-axis position ids.
Each release has its own width, so each ships laws of its own; the VAE is the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VARIANT = "klein-4b"  # the release whose VAE config the advisor reads (every release's is one)
T5_TOKENS = None  # no T5
CLIP_TOKENS = 0
TEXT_TOKENS = 512  # the pipelines' max_sequence_length: every caption padded to it
TRANSFORMER_PREFIX = "Flux2"  # diffusers' Flux2Transformer2DModel
TRAIN_BLOCKS = ("all", "single", "double")  # network.train_blocks
# the small models (double, single blocks) whose differences give one block of each kind
SHAPES = [(1, 1), (2, 1), (1, 2)]
FIXED_BLOCKS = 0  # every block is a swap unit


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
    ``h`` latent (one token per 2x2 patch), their and the text's 4-axis position ids, dev's
    guidance."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    tokens = (h // 2) * (w // 2)
    extra = {"guidance": torch.zeros(batch, **meta)} if config.get("guidance_embeds") else {}
    return dict(hidden_states=torch.zeros(batch, tokens, config["in_channels"], **meta),
                img_ids=torch.zeros(batch, tokens, 4, device="meta"),
                txt_ids=torch.zeros(batch, text, 4, device="meta"), **extra)


def file_transformer_config(section: Any, path: Path) -> dict:
    """The transformer config a FLUX.2 single file loads with: its header's widths and depths
    over ``model.config_dir``'s or the shipped config of its release."""
    import json

    from trainer.families import spec
    from trainer.families.common.files import read_safetensors_header
    from trainer.families.flux2.detect import header_info

    info = header_info(read_safetensors_header(path).tensors)
    if info is None:
        raise ValueError(f"{path}: no FLUX.2 transformer in it")
    root = Path(section.config_dir).expanduser() if section.config_dir else \
        spec("flux2").assets(info.variant)
    base = json.loads((root / "transformer" / "config.json").read_text(encoding="utf-8"))
    return dict(base, **info.config, _class_name="Flux2Transformer2DModel")


# dev's Mistral-Small-3 as the loader builds it frozen: layers 0-30 of 40 (Flux2Pipeline reads
# the hidden states of layers 10, 20 and 30); the rest of the file is never read
MISTRAL_DEPTH = 31
MISTRAL_PREFIX = "text_encoders.mistral3_24b.transformer."  # in an all-in-one dev file
LAYER = "model.layers.0.input_layernorm.weight"  # Qwen3's and Mistral's


def file_parts(section: Any, path: Path) -> dict[str, tuple[Path, str, Any]]:
    """part -> (file, key prefix, which keys the loader reads) of a FLUX.2 single file's VAE
    and text encoder: the files ``model.ae`` and ``model.text_encoder`` name, else the
    all-in-one file's own. The text part is named by what it holds: Qwen3 (its q_norm; klein)
    or dev's Mistral-Small-3, of which the first :data:`MISTRAL_DEPTH` layers are read."""
    from trainer.families.common.files import read_safetensors_header
    from trainer.families.flux2.detect import TEXT_PREFIXES, VAE_PREFIX, header_info

    keys = read_safetensors_header(path).tensors
    info = header_info(keys)
    out: dict[str, tuple[Path, str, Any]] = {}
    if section.ae:
        out["vae"] = (Path(section.ae).expanduser(), "", None)
    elif info is not None and "vae" in info.parts_inside:
        out["vae"] = (path, VAE_PREFIX, None)
    text = getattr(section, "text_encoder", None)
    where = Path(text).expanduser() if text else path
    if text:
        keys = read_safetensors_header(where).tensors
    prefix = next((p for p in (*TEXT_PREFIXES, MISTRAL_PREFIX) + (("",) if text else ())
                   if p + LAYER in keys), None)
    if prefix is None:
        return out
    if prefix + "model.layers.0.self_attn.q_norm.weight" in keys:
        out["qwen3"] = (where, prefix, None)
    else:
        out["mistral3"] = (where, prefix, _first_layers(prefix + "model.layers."))
    return out


def _first_layers(start: str) -> Any:
    """Whether the loader reads a key: not a layer from :data:`MISTRAL_DEPTH` on."""
    def read(key: str) -> bool:
        return not key.startswith(start) or int(key[len(start):].split(".")[0]) < MISTRAL_DEPTH
    return read
