"""FLUX.2 from a diffusers folder (``Flux2KleinPipeline``, ``Flux2Pipeline``) or a single file's
header. Torch-free.

The transformer's layouts (ComfyUI ``comfy/model_detection.py``; diffusers
``loaders/single_file_utils.py`` ``convert_flux2_transformer_checkpoint_to_diffusers``):

- **BFL** (the original's, as BFL and Comfy-Org ship ``flux-2-klein-4b.safetensors``):
  ``double_stream_modulation_img.lin.weight``, ``double_blocks.N.img_attn.qkv`` (fused),
  ``single_blocks.N.linear1``; bare or under ``model.diffusion_model.`` (an all-in-one file adds
  the VAE under ``vae.`` and Qwen3 under ``text_encoders.qwen3_4b.transformer.``);
- **diffusers** (``Flux2Transformer2DModel``'s own names): ``double_stream_modulation_img
  .linear.weight``, ``transformer_blocks.N.attn.to_q``.

FLUX.1 shares ``double_blocks.0.img_attn.qkv.weight``; the shared modulation tells FLUX.2 apart
(so this detection runs before FLUX.1's). The variant is read from the shapes (musubi-tuner's
``flux2_models.py``): hidden width 3072 (5 double + 20 single blocks) klein 4B, 4096 (8 + 24)
klein 9B, 6144 (8 + 48, with a guidance embedder) dev. klein and klein-base have the same keys:
a folder's ``model_index.json`` says ``is_distilled``, a file's name says ``base``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trainer.families.spec import Found

DIT_PREFIX = "model.diffusion_model."
VAE_PREFIX = "vae."
TEXT_PREFIXES = ("text_encoders.qwen3_4b.transformer.", "text_encoders.qwen3_8b.transformer.")
MISTRAL_PREFIX = "text_encoders.mistral3_24b.transformer."
MISTRAL_MARKER = "model.layers.0.post_attention_layernorm.weight"
BFL_MARKER = "double_stream_modulation_img.lin.weight"
DIFFUSERS_MARKER = "double_stream_modulation_img.linear.weight"
VAE_MARKER = "decoder.conv_in.weight"
TEXT_MARKER = "model.layers.0.self_attn.q_norm.weight"
# the setting and the file that give a part a transformer-only file lacks ("qwen3" is the
# family's text-encoder part: Qwen3 for klein, Mistral-Small-3 for dev)
PART_FILES = {"vae": ("model.ae", "flux2-vae.safetensors"),
              "qwen3": ("model.text_encoder", "qwen_3_4b.safetensors (qwen_3_8b.safetensors for "
                                              "klein 9B)")}
DEV_TEXT_FILE = "mistral_3_small_flux2_bf16.safetensors (or _fp8)"
WIDTHS = {3072: "klein-4b", 4096: "klein-9b", 6144: "dev"}
LABELS = {"klein-4b": "FLUX.2 [klein] 4B", "klein-9b": "FLUX.2 [klein] 9B", "dev": "FLUX.2 [dev]",
          "klein-base-4b": "FLUX.2 [klein] base 4B", "klein-base-9b": "FLUX.2 [klein] base 9B"}
PIPELINES = ("Flux2KleinPipeline", "Flux2Pipeline")
MAX_SEQUENCE_LENGTH = 512  # the pipelines' max_sequence_length
# (BFL name, diffusers name) of what the config is read from
NAMES = {"bfl": {"img_in": "img_in.weight", "txt_in": "txt_in.weight",
                 "double": "double_blocks.", "single": "single_blocks.",
                 "norm": "double_blocks.0.img_attn.norm.query_norm.scale",
                 "mlp": "double_blocks.0.img_mlp.0.weight",
                 "guidance": "guidance_in.in_layer.weight"},
         "diffusers": {"img_in": "x_embedder.weight", "txt_in": "context_embedder.weight",
                       "double": "transformer_blocks.", "single": "single_transformer_blocks.",
                       "norm": "transformer_blocks.0.attn.norm_q.weight",
                       "mlp": "transformer_blocks.0.ff.linear_in.weight",
                       "guidance": "time_guidance_embed.guidance_embedder.linear_1.weight"}}


@dataclass(frozen=True)
class Flux2FileInfo:
    """What the header of a FLUX.2 file says."""

    layout: str  # "bfl" | "diffusers"
    prefix: str  # the transformer's key prefix ("" or "model.diffusion_model.")
    parts_inside: frozenset[str]  # of "transformer", "vae", "qwen3"
    dtype: str  # safetensors' dtype of the transformer's weights ("BF16", "F8_E4M3", ...)
    config: dict[str, Any] = field(default_factory=dict)  # the transformer's, from shapes
    variant: str = "klein-4b"  # of the shapes; the loader adds "base" from the file's name
    text_prefix: str = TEXT_PREFIXES[0]

    @property
    def description(self) -> str:
        return f"{LABELS[self.variant]} ({self.dtype} weights, {self.layout} layout)"

    def part_lines(self) -> list[str]:
        """What the file holds and the settings that name the parts it lacks (the doctor)."""
        order = ("transformer", "vae", "qwen3")
        lines = ["holds: " + ", ".join(p for p in order if p in self.parts_inside)]
        files = {**PART_FILES, "qwen3": ("model.text_encoder", DEV_TEXT_FILE)} \
            if self.variant == "dev" else PART_FILES
        return lines + [f"set {files[p][0]} to {files[p][1]}"
                        for p in order[1:] if p not in self.parts_inside]


def with_base(variant: str, base: bool) -> str:
    """klein's variant as klein-base's (``klein-4b`` -> ``klein-base-4b``) where ``base``."""
    return variant.replace("klein-", "klein-base-") if base and "base" not in variant else variant


def from_folder(folder: Path, index: dict[str, Any]) -> Optional[str]:
    return "flux2" if index.get("_class_name") in PIPELINES else None


def base_from_name(path: Path) -> bool:
    """klein-base has klein's keys and configs; its files and folders carry "base" in their
    names (``flux-2-klein-base-4b.safetensors``, ``FLUX.2-klein-base-4B``)."""
    return "base" in Path(path).name.lower()


def _layout(keys: set[str]) -> Optional[tuple[str, str]]:
    for prefix in ("", DIT_PREFIX):
        for layout, marker in (("bfl", BFL_MARKER), ("diffusers", DIFFUSERS_MARKER)):
            if prefix + marker in keys:
                return layout, prefix
    return None


def _count(keys: set[str], prefix: str) -> int:
    blocks = {k[len(prefix):].split(".")[0] for k in keys if k.startswith(prefix)}
    return len({b for b in blocks if b.isdigit()})


def transformer_config(tensors: Mapping[str, Any], prefix: str, layout: str) -> dict[str, Any]:
    """The ``Flux2Transformer2DModel`` config the header's shapes give."""
    names, keys = NAMES[layout], set(tensors)
    hidden, channels = tensors[prefix + names["img_in"]]["shape"]
    head = tensors[prefix + names["norm"]]["shape"][0]
    mlp = tensors[prefix + names["mlp"]]["shape"][0] // 2
    return {"in_channels": channels, "joint_attention_dim": tensors[prefix + names["txt_in"]]
            ["shape"][1], "attention_head_dim": head, "num_attention_heads": hidden // head,
            "num_layers": _count(keys, prefix + names["double"]),
            "num_single_layers": _count(keys, prefix + names["single"]),
            "mlp_ratio": mlp / hidden, "guidance_embeds": prefix + names["guidance"] in keys}


def variant_of(config: Mapping[str, Any]) -> str:
    """The variant of a transformer config (by its hidden width; a tiny one is klein 4B)."""
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    if hidden in WIDTHS:
        return WIDTHS[hidden]
    return "dev" if config.get("guidance_embeds") else "klein-4b"


def header_info(tensors: Mapping[str, Any]) -> Optional[Flux2FileInfo]:
    """The file's facts, or None if it holds no FLUX.2 transformer."""
    keys = set(tensors)
    found = _layout(keys)
    if found is None:
        return None
    layout, prefix = found
    config = transformer_config(tensors, prefix, layout)
    parts, text_prefix = {"transformer"}, TEXT_PREFIXES[0]
    if VAE_PREFIX + VAE_MARKER in keys:
        parts.add("vae")
    for candidate in TEXT_PREFIXES:
        if candidate + TEXT_MARKER in keys:
            parts.add("qwen3")
            text_prefix = candidate
    if MISTRAL_PREFIX + MISTRAL_MARKER in keys:
        parts.add("qwen3")
        text_prefix = MISTRAL_PREFIX
    dtype = tensors[prefix + NAMES[layout]["mlp"]]["dtype"]
    return Flux2FileInfo(layout, prefix, frozenset(parts), dtype, config, variant_of(config),
                         text_prefix=text_prefix)


def from_header(tensors: Mapping[str, Any]) -> Optional[Found]:
    info = header_info(tensors)
    if info is None:
        return None
    return Found("flux2", "single file", info.description, header=info)
