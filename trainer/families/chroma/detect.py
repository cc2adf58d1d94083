"""Chroma from a diffusers folder (``ChromaPipeline``) or a single file's header (torch-free).

A Chroma file is FLUX.1's layout (Black Forest Labs' names: ``double_blocks.N.img_attn.qkv``,
``single_blocks.N.linear1``, ``img_in``, ``txt_in``, ``final_layer.linear``) without the
per-block modulations (``img_mod``, ``txt_mod``, ``modulation``), ``vector_in``,
``time_in`` and ``guidance_in``, plus the modulation approximator ``distilled_guidance_layer.
{in_proj, layers.N.in_layer / out_layer, norms.N.scale, out_proj}`` (diffusers'
``convert_chroma_transformer_checkpoint_to_diffusers``; ComfyUI's ``model_detection.py`` tells
Chroma from FLUX.1 by ``distilled_guidance_layer.norms.0``, diffusers by
``distilled_guidance_layer.in_proj.bias``). Bare (``Chroma1-HD.safetensors`` of
``Comfy-Org/Chroma1-HD``, sd-scripts' ``Chroma.safetensors``) or under
``model.diffusion_model.``; a whole checkpoint adds the VAE under ``first_stage_model.`` (or
``vae.``) and T5 under ``cond_stage_model.t5xxl.transformer.`` (ComfyUI's ``Chroma`` keeps
those default prefixes) or ``text_encoders.t5xxl.transformer.``. Chroma1-HD and Chroma1-Base
have the same keys and shapes: one variant. Chroma Radiance (pixel space, ``nerf_blocks``, no
``img_in``) is another model and is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.families.common.mmdit_detect import (
    DIT_PREFIX,
    FLUX_MARKER,
    VAE_MARKER,
    VAE_PREFIXES,
    FlowFileInfo,
)
from trainer.families.spec import ASSETS, DetectionError, Found

MARKER = "distilled_guidance_layer.in_proj.weight"
ASSET = "chroma1-hd"
LABEL = "Chroma1-HD / Chroma1-Base"
T5_PREFIXES = ("cond_stage_model.t5xxl.transformer.", "text_encoders.t5xxl.transformer.")
T5_MARKER = "encoder.final_layer_norm.weight"


@dataclass(frozen=True)
class ChromaFileInfo(FlowFileInfo):
    """What the header of a Chroma file says (the fields of FLUX.1's record)."""

    @property
    def kind(self) -> str:
        return "chroma"

    @property
    def label(self) -> str:
        return LABEL

    @property
    def version(self) -> str:
        return "chroma"

    @property
    def variant(self) -> str:
        return "hd"


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    return "chroma" if index.get("_class_name") == "ChromaPipeline" else None


def _count(keys: Collection[str], head: str) -> int:
    found = {int(m.group(1)) for k in keys if (m := re.match(re.escape(head) + r"\.(\d+)\.", k))}
    return max(found) + 1 if found else 0


def transformer_config(keys: Collection[str], shape: Any, p: str) -> dict[str, Any]:
    """ChromaTransformer2DModel's config fields that the weights show."""
    inner, in_channels = shape(p + "img_in.weight")
    head = shape(p + "double_blocks.0.img_attn.norm.query_norm.scale")[0]
    hidden, approximator_in = shape(p + MARKER)
    return {"in_channels": in_channels, "out_channels": shape(p + "final_layer.linear.weight")[0],
            "num_layers": _count(keys, p + "double_blocks"),
            "num_single_layers": _count(keys, p + "single_blocks"),
            "attention_head_dim": head, "num_attention_heads": inner // head,
            "joint_attention_dim": shape(p + "txt_in.weight")[1],
            "approximator_num_channels": approximator_in, "approximator_hidden_dim": hidden,
            "approximator_layers": _count(keys, p + "distilled_guidance_layer.layers"),
            "patch_size": 1}


def _parts(keys: Collection[str]) -> dict[str, str]:
    parts = {}
    vae = next((p for p in VAE_PREFIXES if p + VAE_MARKER in keys), None)
    if vae is not None:
        parts["vae"] = vae
    t5 = next((p for p in T5_PREFIXES if p + T5_MARKER in keys), None)
    if t5 is not None:
        parts["t5xxl"] = t5
    return parts


def chroma_info(keys: Collection[str], shape: Any, dtype: Any, shipped: Mapping[str, Any]
                ) -> ChromaFileInfo:
    """The parts, shapes and description of a Chroma file (``shipped``: the released
    transformer config, against which the header's shapes are compared)."""
    keys = set(keys)
    p = next(q for q in (DIT_PREFIX, "") if q + MARKER in keys)
    config = transformer_config(keys, shape, p)
    published = {**shipped, "out_channels": shipped.get("out_channels") or shipped["in_channels"]}
    differences = [f"{k} {v}" for k, v in config.items() if k in published and published[k] != v]
    prefixes = {"transformer": p, **_parts(keys)}
    weight_dtype = dtype(p + FLUX_MARKER)
    notes = [f"{weight_dtype} weights"]
    if differences:
        notes.append("not the published size: " + ", ".join(differences))
    inside = [part for part in ("vae", "t5xxl") if part in prefixes]
    notes.append("with " + ", ".join(inside) + " inside" if inside else "transformer only")
    return ChromaFileInfo(ASSET, frozenset(prefixes), f"Chroma ({'; '.join(notes)})",
                          weight_dtype, prefixes, config, not differences)


def from_header(tensors: Mapping[str, Any]) -> Optional[Found]:
    keys = tensors.keys()
    if any(k.startswith(("nerf_blocks.", DIT_PREFIX + "nerf_blocks.")) for k in keys):
        raise DetectionError("it is Chroma Radiance (a pixel-space model, nerf_blocks.*), "
                             "which is not trained here; use Chroma1-HD or Chroma1-Base")
    if not any(p + FLUX_MARKER in keys and p + MARKER in keys for p in (DIT_PREFIX, "")):
        return None
    shipped = json.loads((ASSETS / ASSET / "transformer" / "config.json").read_text("utf-8"))
    info = chroma_info(keys, lambda k: tuple(tensors[k]["shape"]),
                       lambda k: tensors[k]["dtype"], shipped)
    return Found("chroma", "single file", info.description, header=info)
