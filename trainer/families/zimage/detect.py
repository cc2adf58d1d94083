"""Z-Image from a diffusers folder (``ZImagePipeline``) or a single file's header. Torch-free.

The transformer's layouts (ComfyUI ``comfy/model_detection.py``; diffusers
``loaders/single_file_utils.py`` ``CHECKPOINT_KEY_NAMES["z-image-turbo"]``):

- **native** (the original's, as Comfy-Org ships ``z_image_turbo_bf16.safetensors``):
  ``cap_embedder.1.weight`` and ``noise_refiner.0.attention.k_norm.weight``, fused
  ``layers.N.attention.qkv``; bare or under ``model.diffusion_model.`` (an all-in-one file adds
  the VAE under ``vae.`` and Qwen3 under ``text_encoders.qwen3_4b.transformer.``);
- **diffusers** (``ZImageTransformer2DModel``'s own names): ``noise_refiner.0.attention.norm_k
  .weight``, split ``to_q``/``to_k``/``to_v``, ``all_x_embedder.2-1``.

``cap_embedder.1.weight`` is [dim, caption width]: 2560 (Qwen3-4B) is Z-Image, 2304 (Gemma 2)
Lumina 2, which shares the layout and is not trained here. Turbo and Base have the same keys;
the file's name says which (``base`` when it names neither ``turbo`` nor a distilled release).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trainer.families.spec import DetectionError, Found

DIT_PREFIX = "model.diffusion_model."
VAE_PREFIX = "vae."
TEXT_PREFIX = "text_encoders.qwen3_4b.transformer."
NATIVE_MARKERS = ("cap_embedder.1.weight", "noise_refiner.0.attention.k_norm.weight")
DIFFUSERS_MARKERS = ("cap_embedder.1.weight", "noise_refiner.0.attention.norm_k.weight")
VAE_MARKER = "decoder.conv_in.weight"
TEXT_MARKER = "model.layers.0.self_attn.q_norm.weight"
LUMINA2_CAPTION = 2304
LABELS = {"turbo": "Z-Image Turbo", "base": "Z-Image"}


@dataclass(frozen=True)
class ZImageFileInfo:
    """What the header of a Z-Image file says."""

    layout: str  # "native" | "diffusers"
    prefix: str  # the transformer's key prefix ("" or "model.diffusion_model.")
    parts_inside: frozenset[str]  # of "transformer", "vae", "qwen3"
    dtype: str  # safetensors' dtype of the transformer's weights ("BF16", "F8_E4M3", ...)
    config: dict[str, Any] = field(default_factory=dict)  # the transformer's, from shapes
    variant: str = "turbo"

    @property
    def description(self) -> str:
        return f"{LABELS[self.variant]} ({self.dtype} weights, {self.layout} layout)"


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    return "zimage" if index.get("_class_name") == "ZImagePipeline" else None


def _layout(keys: set[str]) -> Optional[tuple[str, str]]:
    for prefix in ("", DIT_PREFIX):
        for layout, markers in (("native", NATIVE_MARKERS), ("diffusers", DIFFUSERS_MARKERS)):
            if all(prefix + m in keys for m in markers):
                return layout, prefix
    return None


def _count(keys: set[str], prefix: str) -> int:
    blocks = {k[len(prefix):].split(".")[0] for k in keys if k.startswith(prefix)}
    return len({b for b in blocks if b.isdigit()})


def transformer_config(tensors: Mapping[str, Any], prefix: str, layout: str) -> dict[str, Any]:
    """The ``ZImageTransformer2DModel`` config the header's shapes give (the rest from the
    shipped config)."""
    keys = set(tensors)
    dim, caption = tensors[prefix + "cap_embedder.1.weight"]["shape"]
    norm = "k_norm" if layout == "native" else "norm_k"
    head = tensors[f"{prefix}noise_refiner.0.attention.{norm}.weight"]["shape"][0]
    embed = "x_embedder.weight" if layout == "native" else "all_x_embedder.2-1.weight"
    return {"dim": dim, "cap_feat_dim": caption, "n_heads": dim // head,
            "n_kv_heads": dim // head, "in_channels": tensors[prefix + embed]["shape"][1] // 4,
            "n_layers": _count(keys, prefix + "layers."),
            "n_refiner_layers": _count(keys, prefix + "noise_refiner.")}


def _variant(name: str) -> str:
    return "turbo" if "turbo" in name.lower() else "base"


def header_info(tensors: Mapping[str, Any], name: str = "") -> Optional[ZImageFileInfo]:
    """The file's facts, or None if it holds no Z-Image transformer."""
    keys = set(tensors)
    found = _layout(keys)
    if found is None:
        return None
    layout, prefix = found
    config = transformer_config(tensors, prefix, layout)
    if config["cap_feat_dim"] == LUMINA2_CAPTION:
        raise DetectionError("it is a Lumina 2 transformer (2304-wide Gemma 2 captions), "
                             "which shares Z-Image's layout; Lumina 2 is not trained here")
    if prefix + "siglip_embedder.0.weight" in keys:
        raise DetectionError("it is a Z-Image Omni transformer (with a SigLIP embedder), "
                             "which is not trained here; use Z-Image Turbo or Base")
    parts = {"transformer"}
    if VAE_PREFIX + VAE_MARKER in keys:
        parts.add("vae")
    if TEXT_PREFIX + TEXT_MARKER in keys:
        parts.add("qwen3")
    dtype = tensors.get(prefix + "layers.0.feed_forward.w1.weight",
                        tensors[prefix + "cap_embedder.1.weight"])["dtype"]
    return ZImageFileInfo(layout, prefix, frozenset(parts), dtype, config,
                          _variant(name) if name else "turbo")


def from_header(tensors: Mapping[str, Any]) -> Optional[Found]:
    info = header_info(tensors)
    if info is None:
        return None
    return Found("zimage", "single file", info.description, header=info)
