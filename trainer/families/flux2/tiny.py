"""FLUX.2 klein's tiny twin (``embedded:tiny-flux2``): a ``Flux2KleinPipeline`` folder built
offline from configs with a fixed seed, small enough to train on a CPU in a second.

What tells the family apart is kept, the sizes are not: a ``Flux2Transformer2DModel`` in
klein's form (no guidance embedder; shared modulation, gated MLP, 4 rotary axes adding up to the
head width) on the 2x2-patchified latents (``in_channels = 4 * latent channels``), whose text
input is three stacked Qwen3 hidden states side by side; a ``Qwen3ForCausalLM`` (the class the
pipeline names) deep enough for klein's layers 9, 18 and 27 (28 layers, so 27 is not the last,
normed one, as in Qwen3-4B's 36); the tiny Qwen2 tokenizer with Qwen3's chat template
(:mod:`trainer.families.common.tiny_qwen`); an ``AutoencoderKLFlux2`` with quant convs and
BatchNorm statistics drawn away from 0 / 1 (so that their use tells in the tests); FLUX.1's
dynamically shifted scheduler (ai-toolkit's copy for FLUX.2).

The dev twin (``embedded:tiny-flux2-dev``) is a ``Flux2Pipeline`` folder: the transformer with a
guidance embedder, reading three stacked hidden states of a ``Mistral3ForConditionalGeneration``
(a tiny Mistral language model 32 layers deep, so that dev's layer 30 is not the last, normed
one, as in Mistral-Small-3's 40; a one-layer Pixtral vision tower the class requires, which text
prompts never reach) and the tiny Mistral tokenizer with the pipeline's chat form
(:mod:`trainer.families.common.tiny_mistral`). The VAE and scheduler are klein's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.families.common.tiny_mmdit import flux_scheduler
from trainer.families.common.tiny_qwen import build_qwen_tokenizer
from trainer.families.flux2.conditioning import DEV_OUT_LAYERS, OUT_LAYERS

TINY_SEED = 0  # the tiny twins' seed (trainer/families/sd/tiny.py)
TEXT_WIDTH = 32  # the tiny Qwen3's hidden size (2560 in Qwen3-4B)
TEXT_LAYERS = 28  # klein stacks hidden_states[9], [18], [27]
LATENT_CHANNELS = 8  # 32 in FLUX.2's VAE
ROPE_AXES = (4, 4, 4, 4)  # (32, 32, 32, 32) in FLUX.2: sum = attention_head_dim
BUILDER = "tiny-flux2"
DEV_BUILDER = "tiny-flux2-dev"  # the dev twin: its id's tail, the folder's name
DEV_TEXT_LAYERS = 32  # dev stacks hidden_states[10], [20], [30]


def _text_encoder(tokenizer):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH,
                         intermediate_size=2 * TEXT_WIDTH, num_hidden_layers=TEXT_LAYERS,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=1024, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id)
    return Qwen3ForCausalLM(config)


def _mistral3(tokenizer):
    """A tiny ``Mistral3ForConditionalGeneration``: Mistral-Small-3's shapes scaled down."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text = dict(model_type="mistral", vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH,
                intermediate_size=2 * TEXT_WIDTH, num_hidden_layers=DEV_TEXT_LAYERS,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                max_position_embeddings=1024, rope_theta=1_000_000_000.0, rms_norm_eps=1e-5,
                sliding_window=None, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    vision = dict(model_type="pixtral", hidden_size=16, intermediate_size=32,
                  num_hidden_layers=1, num_attention_heads=2, head_dim=8, patch_size=14,
                  image_size=56)
    config = Mistral3Config(text_config=text, vision_config=vision,
                            image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
                            spatial_merge_size=2, tie_word_embeddings=False)
    return Mistral3ForConditionalGeneration(config)


def _transformer(dev: bool = False):
    from diffusers import Flux2Transformer2DModel

    layers = DEV_OUT_LAYERS if dev else OUT_LAYERS
    return Flux2Transformer2DModel(
        patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=2, num_single_layers=2,
        attention_head_dim=sum(ROPE_AXES), num_attention_heads=2,
        joint_attention_dim=len(layers) * TEXT_WIDTH, timestep_guidance_channels=32,
        mlp_ratio=3.0, axes_dims_rope=ROPE_AXES, rope_theta=2000, guidance_embeds=dev)


def _vae():
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, sample_size=64,
        block_out_channels=(16, 16, 32, 32), norm_num_groups=8, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
    with torch.no_grad():
        vae.bn.running_mean.normal_(0.0, 0.5)
        vae.bn.running_var.uniform_(0.5, 2.0)
    return vae


def build_flux2_components(seed: int = TINY_SEED) -> dict:
    """Transformer, VAE, Qwen3 text encoder, tokenizer and scheduler of the tiny klein."""
    tokenizer = build_qwen_tokenizer()
    torch.manual_seed(seed)
    transformer = _transformer()
    torch.manual_seed(seed + 1)
    vae = _vae()
    torch.manual_seed(seed + 2)
    text_encoder = _text_encoder(tokenizer)
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": tokenizer, "scheduler": flux_scheduler()}


def build_flux2_dev_components(seed: int = TINY_SEED) -> dict:
    """Transformer (with a guidance embedder), VAE, Mistral3 text encoder, tokenizer and
    scheduler of the tiny dev."""
    from trainer.families.common.tiny_mistral import build_mistral_tokenizer

    tokenizer = build_mistral_tokenizer()
    torch.manual_seed(seed)
    transformer = _transformer(dev=True)
    torch.manual_seed(seed + 1)
    vae = _vae()
    torch.manual_seed(seed + 2)
    text_encoder = _mistral3(tokenizer)
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": tokenizer, "scheduler": flux_scheduler()}


def _write(pipe, path: Path, seed: int, builder: str) -> Path:
    tmp = path.with_name(path.name + ".partial")
    pipe.save_pretrained(tmp, safe_serialization=True)
    (tmp / "embedded.json").write_text(json.dumps({"seed": seed, "builder": builder}))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def save_tiny_flux2(path: str | Path, seed: int = TINY_SEED) -> Path:
    """Write the tiny klein as a ``Flux2KleinPipeline`` folder (distilled), with
    ``embedded.json``."""
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline(**build_flux2_components(seed), is_distilled=True)
    return _write(pipe, Path(path), seed, BUILDER)


def save_tiny_flux2_dev(path: str | Path, seed: int = TINY_SEED) -> Path:
    """Write the tiny dev as a ``Flux2Pipeline`` folder, with ``embedded.json``."""
    from diffusers import Flux2Pipeline

    return _write(Flux2Pipeline(**build_flux2_dev_components(seed)), Path(path), seed,
                  DEV_BUILDER)


def ensure(folder: Path, name: str = "flux2") -> Path:
    """The tiny twin's folder, built on first use: the dev twin where the folder is named
    after its id (``embedded:tiny-flux2-dev`` -> ``tiny-flux2-dev``), else klein."""
    folder = Path(folder)
    if not (folder / "model_index.json").is_file():
        (save_tiny_flux2_dev if folder.name == DEV_BUILDER else save_tiny_flux2)(folder)
    return folder
