"""Qwen-Image's tiny twin (``embedded:tiny-qwen-image``), built offline from configs with a fixed
seed, as a ``QwenImagePipeline`` folder.

What tells the family apart is kept, the sizes are not: a ``QwenImageTransformer2DModel`` on the
2x2-packed 16-channel latents (``in_channels`` 64) whose ``joint_attention_dim`` is the text
encoder's width and whose rotary axes add up to the head width (16, 56, 56 of 128 in the real
model); a ``Qwen2_5_VLForConditionalGeneration`` (the class the pipeline takes, with a one-block
vision tower, so that the file layout is the real one) over the tiny Qwen tokenizer of
:mod:`trainer.families.common.tiny_qwen`; an ``AutoencoderKLQwenImage`` with the real model's
block layout (``dim_mult`` of four, two residual blocks: the Wan 2.1 layout that diffusers'
``convert_wan_vae_to_diffusers`` and ComfyUI read) at a small width, with the real per-channel
``latents_mean`` / ``latents_std`` (the class's defaults); the real scheduler config.

Its edit twin (``embedded:tiny-qwen-image-edit``) is the same components as a
``QwenImageEditPipeline`` folder, with the processor the edit pipelines read the control image
through: Qwen2-VL's PIL image processor (patch 14, merge 2, as Qwen2.5-VL's; fewer pixels at
most, so that a control is a few tokens) over the tiny tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from trainer.families.spec import ASSETS

TEXT_WIDTH = 32  # Qwen2.5-VL-7B: 3584
ROPE_AXES = (4, 6, 6)  # (16, 56, 56) in Qwen-Image: sum = attention_head_dim
BUILDER = "tiny-qwen-image"
EDIT_BUILDER = "tiny-qwen-image-edit"
EDIT_MAX_PIXELS = 28 * 28 * 16  # Qwen2.5-VL's processor: 28 * 28 * 16384
TINY_SEED = 0  # the other twins' seed (trainer/families/sd/tiny.py)


def scheduler():
    """Qwen-Image's scheduler, from the shipped config (dynamic shift by image size)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler.from_pretrained(
        str(ASSETS / "qwen-image"), subfolder="scheduler", local_files_only=True)


def text_encoder(tokenizer):
    """A two-layer Qwen2.5-VL, ``TEXT_WIDTH`` wide, with a one-block vision tower."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|vision_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    text = dict(vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=2048, rms_norm_eps=1e-6,
                rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2]},
                bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                  out_hidden_size=TEXT_WIDTH, fullatt_block_indexes=[0], window_size=112)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def vae():
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                  temperal_downsample=[False, True, True])


def transformer(layers: int = 2):
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=layers,
        attention_head_dim=sum(ROPE_AXES), num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH, axes_dims_rope=ROPE_AXES)


def build_components(seed: int = TINY_SEED) -> dict:
    """The tiny QwenImagePipeline's components."""
    from trainer.families.common.tiny_qwen import build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer()
    torch.manual_seed(seed)
    denoiser = transformer()
    torch.manual_seed(seed + 1)
    autoencoder = vae()
    torch.manual_seed(seed + 2)
    encoder = text_encoder(tokenizer)
    return {"transformer": denoiser, "vae": autoencoder, "text_encoder": encoder,
            "tokenizer": tokenizer, "scheduler": scheduler()}


def image_processor():
    """Qwen2.5-VL's image processor (its mean, std, patch and merge sizes), the PIL one."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        min_pixels=56 * 56, max_pixels=EDIT_MAX_PIXELS, patch_size=14, merge_size=2,
        temporal_patch_size=2, image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711])


def build_edit_components(seed: int = TINY_SEED) -> dict:
    """The tiny QwenImageEditPipeline's components: the twin's and a processor."""
    from trainer.families.qwen_image.edit import edit_processor

    parts = build_components(seed)
    parts["processor"] = edit_processor(parts["tokenizer"], image_processor())
    return parts


def _save_edit(folder: Path, seed: int) -> None:
    """A QwenImageEditPipeline folder; its processor as the real folders name it."""
    from diffusers import QwenImageEditPipeline

    QwenImageEditPipeline(**build_edit_components(seed)).save_pretrained(
        folder, safe_serialization=True)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))


def save(path: str | Path, seed: int = TINY_SEED, builder: str = BUILDER) -> Path:
    """Write the tiny Qwen-Image (or, ``builder`` = EDIT_BUILDER, its edit twin) as a
    diffusers folder with ``embedded.json``."""
    from diffusers import QwenImagePipeline

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    if builder == EDIT_BUILDER:
        _save_edit(tmp, seed)
    else:
        QwenImagePipeline(**build_components(seed)).save_pretrained(tmp,
                                                                    safe_serialization=True)
    (tmp / "embedded.json").write_text(json.dumps({"seed": seed, "builder": builder}))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def ensure(folder: Path, name: str = "qwen_image") -> Path:
    """The tiny twin's folder (the edit twin's for a folder named like it), built on first
    use."""
    folder = Path(folder)
    if not (folder / "model_index.json").is_file():
        save(folder, builder=EDIT_BUILDER if folder.name == EDIT_BUILDER else BUILDER)
    return folder
