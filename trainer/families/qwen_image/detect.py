"""Qwen-Image from a diffusers folder (``QwenImagePipeline``; the edit pipelines are named too) or
a single file's header: the transformer in its own layout, which is diffusers' (ComfyUI's native
names are the diffusers names: ``txt_norm.weight``, ``img_in.weight`` [3072, 64],
``transformer_blocks.N``), bare as Comfy-Org ships ``qwen_image_bf16.safetensors`` or under
``model.diffusion_model.`` (ComfyUI's all-in-one checkpoints, with ``vae.`` and
``text_encoders.qwen25_7b.transformer.``). Qwen-Image-Edit-2511 carries the key
``__index_timestep_zero__`` (ComfyUI's marker for its zero-timestep reference tokens); Edit and
2509 have the base model's keys (told apart by a folder's pipeline, for a file by
``model.model_version``: single_file.file_variant). Torch-free."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainer.families.spec import Found

DIT = "model.diffusion_model."
MARKERS = ("txt_norm.weight", "img_in.weight", "txt_in.weight")
EDIT_2511 = "__index_timestep_zero__"
LAYERED = "time_text_embed.addition_t_embedding.weight"
TEXT_PREFIX = "text_encoders.qwen25_7b.transformer."
VAE_PREFIX = "vae."
# the pipeline classes of diffusers folders -> the variant they hold
PIPELINES = {"QwenImagePipeline": "base", "QwenImageEditPipeline": "edit",
             "QwenImageEditPlusPipeline": "edit-2509"}
LABELS = {"base": "Qwen-Image", "edit": "Qwen-Image-Edit", "edit-2509": "Qwen-Image-Edit-2509",
          "edit-2511": "Qwen-Image-Edit-2511", "layered": "Qwen-Image-Layered"}
_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.")


@dataclass(frozen=True)
class QwenFileInfo:
    """What a Qwen-Image single file holds, from its header."""

    prefix: str  # "" or "model.diffusion_model."
    variant: str  # "base", "edit-2511", "layered"
    layers: int
    width: int  # img_in's output (3072)
    in_channels: int  # img_in's input (64)
    text_width: int  # txt_in's input (3584: Qwen2.5-VL-7B)
    parts: tuple[str, ...] = ("transformer",)  # + "vae", "qwen25_7b" in an all-in-one file
    fp8: bool = False  # the transformer's weights stored in float8
    scaled: bool = False  # ComfyUI's scaled fp8 (``scale_weight`` / ``comfy_quant``)

    @property
    def label(self) -> str:
        return LABELS[self.variant]

    @property
    def description(self) -> str:
        parts = " + ".join(p for p in self.parts)
        store = " (scaled fp8)" if self.scaled else " (fp8)" if self.fp8 else ""
        return f"{self.label}, {self.layers} blocks{store}: {parts}"

    @property
    def trainable(self) -> bool:
        return self.variant != "layered"

    def part_lines(self) -> list[str]:
        """The doctor's lines: what the file holds, the settings that name the rest."""
        lines = [f"holds: {', '.join(self.parts)}"]
        for part, setting, name in (("vae", "model.vae", "qwen_image_vae.safetensors"),
                                    ("qwen25_7b", "model.text_encoder",
                                     "qwen_2.5_vl_7b.safetensors")):
            if part not in self.parts:
                lines.append(f"set {setting} to {name} (Comfy-Org/Qwen-Image_ComfyUI)")
        if not self.trainable:
            lines.append(f"{self.label} does not train yet")
        if self.variant == "base":  # an Edit or 2509 file has these keys too
            lines.append("a Qwen-Image-Edit or -Edit-2509 file has these keys: set "
                         "model.model_version to 'qwen_image_edit' or 'qwen_image_edit_2509'")
        return lines


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    return "qwen_image" if index.get("_class_name") in PIPELINES else None


def folder_variant(index: dict[str, Any], transformer_config: Mapping[str, Any]) -> str:
    """The variant of a diffusers folder: its pipeline, 2511 by ``zero_cond_t``."""
    if transformer_config.get("zero_cond_t"):
        return "edit-2511"
    if transformer_config.get("use_additional_t_cond"):
        return "layered"
    return PIPELINES.get(index.get("_class_name"), "base")


def _prefix(keys: Any) -> Optional[str]:
    for prefix in ("", DIT):
        if all(prefix + m in keys for m in MARKERS):
            return prefix
    return None


def from_header(tensors: Mapping[str, Any]) -> Optional[Found]:
    """The file's facts (:class:`QwenFileInfo`) when it holds a Qwen-Image transformer."""
    keys = tensors.keys()
    prefix = _prefix(keys)
    if prefix is None:
        return None
    img_in = tuple(tensors[prefix + "img_in.weight"]["shape"])
    txt_in = tuple(tensors[prefix + "txt_in.weight"]["shape"])
    blocks = {int(m.group(1)) for k in keys if k.startswith(prefix)
              and (m := _BLOCK.match(k[len(prefix):]))}
    variant = ("edit-2511" if prefix + EDIT_2511 in keys else
               "layered" if prefix + LAYERED in keys else "base")
    parts = ["transformer"]
    if any(k.startswith(VAE_PREFIX) for k in keys):
        parts.append("vae")
    if any(k.startswith(TEXT_PREFIX) for k in keys):
        parts.append("qwen25_7b")
    weight = tensors[prefix + "transformer_blocks.0.attn.to_q.weight"]["dtype"] \
        if prefix + "transformer_blocks.0.attn.to_q.weight" in keys else ""
    scaled = any(k.startswith(prefix) and (k.endswith(".scale_weight") or
                                           k.endswith(".comfy_quant")) for k in keys)
    info = QwenFileInfo(prefix, variant, len(blocks), img_in[0], img_in[1], txt_in[1],
                        tuple(parts), weight.startswith("F8"), scaled)
    return Found("qwen_image", "single file", info.description, header=info)
