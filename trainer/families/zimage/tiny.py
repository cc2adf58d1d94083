"""Z-Image's tiny twin (``embedded:tiny-zimage``): a ``ZImagePipeline`` folder built offline from
configs with a fixed seed, small enough to train on a CPU in a second.

What tells the family apart is kept, the sizes are not: a ``ZImageTransformer2DModel`` with 2x2
patches, RMS qk-norm, noise and context refiners and ``cap_feat_dim`` = the text encoder's width;
a ``Qwen3Model`` (the class the real folder's ``model_index.json`` names) with q/k norms; the
tiny Qwen2 tokenizer with the chat template (:mod:`trainer.families.common.tiny_qwen`); the
FLUX.1-style 16-channel VAE (0.3611 / 0.1159) of :mod:`trainer.families.common.tiny_mmdit`; and
Z-Image Turbo's scheduler, a static shift of 3.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.families.common.tiny_mmdit import FLUX_VAE, _flow_vae
from trainer.families.common.tiny_qwen import build_qwen_tokenizer
from trainer.families.sd.tiny import TINY_SEED

TEXT_WIDTH = 32  # the tiny Qwen3's hidden size = the DiT's cap_feat_dim (2560 in Qwen3-4B)
DIT_DIM = 32
ROPE_AXES = (4, 6, 6)  # sum = the head width (DIT_DIM / 2 heads); (32, 48, 48) in Z-Image
BUILDER = "tiny-zimage"


def zimage_scheduler():
    """Z-Image Turbo's scheduler: flow matching with a static shift of 3 (no dynamic shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                           use_dynamic_shifting=False)


def _text_encoder(tokenizer):
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH,
                         intermediate_size=2 * TEXT_WIDTH, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=1024, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id)
    return Qwen3Model(config)


def _transformer():
    from diffusers import ZImageTransformer2DModel

    return ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=DIT_DIM, n_layers=2,
        n_refiner_layers=1, n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True,
        cap_feat_dim=TEXT_WIDTH, rope_theta=256.0, t_scale=1000.0, axes_dims=list(ROPE_AXES),
        axes_lens=[1536, 512, 512])


def build_zimage_components(seed: int = TINY_SEED) -> dict:
    """Transformer, VAE, Qwen3 text encoder, tokenizer and scheduler of the tiny Z-Image."""
    tokenizer = build_qwen_tokenizer()
    torch.manual_seed(seed)
    transformer = _transformer()
    # the learned pad tokens start at zero; random ones make a padded token tell in the tests
    with torch.no_grad():
        transformer.x_pad_token.normal_()
        transformer.cap_pad_token.normal_()
    torch.manual_seed(seed + 1)
    vae = _flow_vae(**FLUX_VAE)
    torch.manual_seed(seed + 2)
    text_encoder = _text_encoder(tokenizer)
    return {"transformer": transformer, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": tokenizer, "scheduler": zimage_scheduler()}


def save_tiny_zimage(path: str | Path, seed: int = TINY_SEED) -> Path:
    """Write the tiny Z-Image as a ``ZImagePipeline`` folder, with ``embedded.json``."""
    from diffusers import ZImagePipeline

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    ZImagePipeline(**build_zimage_components(seed)).save_pretrained(tmp, safe_serialization=True)
    (tmp / "embedded.json").write_text(json.dumps({"seed": seed, "builder": BUILDER}))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def ensure(folder: Path, name: str = "zimage") -> Path:
    """The tiny Z-Image folder, built on first use."""
    folder = Path(folder)
    if not (folder / "model_index.json").is_file():
        save_tiny_zimage(folder)
    return folder
