"""Chroma's tiny twin (``embedded:tiny-chroma``), built offline from configs with a fixed seed.

A ``ChromaTransformer2DModel`` of one double and one single block (2 heads of 16, FLUX.1's
2x2-packed 16 latent channels, a 2-layer modulation approximator), the tiny T5 and its
tokenizer and FLUX.1's tiny autoencoder and scheduler, as :mod:`trainer.families.common.
tiny_mmdit` builds them for the tiny FLUX.1 (Chroma reads T5 alone: no CLIP-L)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.families.common.tiny_mmdit import (
    FLUX_ROPE_AXES,
    FLUX_T5_MAX_LENGTH,
    FLUX_VAE,
    FLUX_WIDTHS,
    LATENT_CHANNELS,
    TINY_SEED,
    _flow_vae,
    _t5_encoder,
    build_t5_tokenizer,
    flux_scheduler,
)

BUILDER = "tiny-chroma"
APPROXIMATOR = {"approximator_num_channels": 16, "approximator_hidden_dim": 32,
                "approximator_layers": 2}


def tiny_transformer_config() -> dict:
    """The tiny transformer's config (its rotary axes add up to the head width)."""
    return dict(patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=1, num_single_layers=1,
                attention_head_dim=sum(FLUX_ROPE_AXES), num_attention_heads=2,
                joint_attention_dim=FLUX_WIDTHS["t5"], axes_dims_rope=FLUX_ROPE_AXES,
                **APPROXIMATOR)


def build_chroma_components(seed: int = TINY_SEED) -> dict:
    """Transformer, VAE, T5, its tokenizer and the scheduler of the tiny Chroma
    (``ChromaPipeline``'s components)."""
    from diffusers import ChromaTransformer2DModel

    tokenizer = build_t5_tokenizer(FLUX_T5_MAX_LENGTH)
    torch.manual_seed(seed)
    transformer = ChromaTransformer2DModel(**tiny_transformer_config())
    torch.manual_seed(seed + 1)
    vae = _flow_vae(**FLUX_VAE)
    torch.manual_seed(seed + 3)
    text_encoder = _t5_encoder(tokenizer, FLUX_WIDTHS["t5"])
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": tokenizer, "scheduler": flux_scheduler()}


def save_tiny_chroma(path: str | Path, seed: int = TINY_SEED) -> Path:
    """Write the tiny Chroma as a diffusers ``ChromaPipeline`` folder with ``embedded.json``."""
    from diffusers import ChromaPipeline

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    ChromaPipeline(**build_chroma_components(seed)).save_pretrained(tmp, safe_serialization=True)
    (tmp / "embedded.json").write_text(json.dumps({"seed": seed, "builder": BUILDER}))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def ensure(folder: Path, name: str = "chroma") -> Path:
    """The tiny Chroma's folder, built on first use."""
    folder = Path(folder)
    if not (folder / "model_index.json").is_file():
        save_tiny_chroma(folder)
    return folder
