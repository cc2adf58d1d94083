"""FLUX.1 and SD 3.5 single files: which family a file holds, what is inside, and its shapes.

Detection reads the safetensors header only (key names, shapes, dtypes), never a weight, as
:mod:`trainer.families.sd.detect` does for the UNet families. The layouts, checked against
diffusers 0.42.1 (``loaders/single_file_utils.py``: ``CHECKPOINT_KEY_NAMES``, ``infer_diffusers_
model_type``, the FLUX/SD3 converters) and ComfyUI (``comfy/supported_models.py``: ``Flux``
and ``SD3``'s ``vae_key_prefix`` / ``text_encoder_key_prefix``):

- **FLUX.1** transformer in Black Forest Labs' layout: ``double_blocks.N.img_attn.qkv.weight``,
  ``single_blocks.N.linear1.weight``, ... bare (BFL's ``flux1-dev.safetensors``) or under
  ``model.diffusion_model.`` (ComfyUI/Forge). ``guidance_in.*`` (the distilled guidance
  embedding) makes it FLUX.1-dev; without it, FLUX.1-schnell. An all-in-one file adds the VAE
  under ``vae.`` and the text encoders under ``text_encoders.clip_l.transformer.`` and
  ``text_encoders.t5xxl.transformer.`` (transformers' names).
- **SD 3 / 3.5** in Stability's layout: ``model.diffusion_model.joint_blocks.N.{x_block,
  context_block}...``, with the VAE under ``first_stage_model.`` and optionally
  ``text_encoders.{clip_l,clip_g,t5xxl}.transformer.``. 3.5 medium has a second self-attention
  in some image blocks (``x_block.attn2``, MMDiT-X); 3.5 large has QK RMS norms (``attn.ln_q``)
  and no ``attn2``; SD 3 (3.0) medium has neither.

The transformer's shapes (depth, width, heads, embedding widths) come from the header
(``FlowFileInfo.transformer_config``), so a small file of the same layout (the tests' tiny
models) is recognised as well; what weights do not show (FLUX's rotary axes, SD3's default
sample size) comes from the family's shipped config in ``trainer/assets/families/``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trainer.families.spec import ASSETS, DetectionError

DIT_PREFIX = "model.diffusion_model."
TEXT_PREFIXES = {"clip_l": "text_encoders.clip_l.transformer.",
                 "clip_g": "text_encoders.clip_g.transformer.",
                 "t5xxl": "text_encoders.t5xxl.transformer."}
TEXT_MARKERS = {"clip_l": "text_model.final_layer_norm.weight",
                "clip_g": "text_model.final_layer_norm.weight",
                "t5xxl": "encoder.final_layer_norm.weight"}
VAE_PREFIXES = ("vae.", "first_stage_model.")
VAE_MARKER = "decoder.conv_in.weight"
FLUX_MARKER = "double_blocks.0.img_attn.qkv.weight"
FLUX_MODULATION = "double_blocks.0.img_mod.lin.weight"  # FLUX.1's own (Chroma's blocks have none)
SD3_MARKER = "joint_blocks.0.x_block.attn.qkv.weight"
LABELS = {"flux1-dev": "FLUX.1-dev, guidance-distilled", "flux1-schnell": "FLUX.1-schnell",
          "sd35-large": "SD 3.5 large", "sd35-medium": "SD 3.5 medium",
          "sd3-medium": "SD 3 medium"}
VARIANTS = {"flux1-dev": "dev", "flux1-schnell": "schnell", "sd35-large": "5-large",
            "sd35-medium": "5-medium", "sd3-medium": "medium"}
REQUIRED = {"flux": ("transformer", "vae", "clip_l", "t5xxl"),
            "sd3": ("transformer", "vae", "clip_l", "clip_g", "t5xxl")}
WHERE = {"vae": "model.ae", "clip_l": "model.clip_l", "clip_g": "model.clip_g",
         "t5xxl": "model.t5xxl"}  # the setting that names a part the file lacks
FILES = {"vae": "the family's VAE (ae.safetensors of black-forest-labs/FLUX.1-schnell or -dev; "
                "SD 3.5's vae/diffusion_pytorch_model.safetensors)",
         "clip_l": "clip_l.safetensors (comfyanonymous/flux_text_encoders, or SD 3.5's "
                   "text_encoders/)",
         "clip_g": "clip_g.safetensors (SD 3.5's text_encoders/)",
         "t5xxl": "t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn.safetensors "
                  "(comfyanonymous/flux_text_encoders, or SD 3.5's text_encoders/)"}
LORA = re.compile(r"(^|[._])lora_(unet|te\d?|down|up|A|B)([._]|$)")
Shape = Callable[[str], tuple[int, ...]]


@dataclass(frozen=True)
class FlowFileInfo:
    """What the header of a FLUX.1 / SD 3.x file says."""

    family: str  # "flux1-dev" | "flux1-schnell" | "sd35-medium" | "sd35-large" | "sd3-medium"
    parts_inside: frozenset[str]  # of "transformer", "vae", "clip_l", "clip_g", "t5xxl"
    description: str  # for the log: "FLUX.1-dev, guidance-distilled (BF16 weights, ...)"
    dtype: str  # safetensors' name of the transformer's dtype: "BF16", "F8_E4M3", ...
    prefixes: dict[str, str] = field(default_factory=dict)  # part -> key prefix in the file
    transformer_config: dict[str, Any] = field(default_factory=dict)  # from the header
    published_size: bool = True  # the header's shapes are those of the released model

    @property
    def kind(self) -> str:
        """``flux`` or ``sd3``: the pipeline the family loads into."""
        return "flux" if self.family.startswith("flux") else "sd3"

    @property
    def label(self) -> str:
        return LABELS[self.family]

    @property
    def version(self) -> str:
        """``flux1`` or ``sd3``: the values of model.model_version (the folder loader's)."""
        return "flux1" if self.kind == "flux" else "sd3"

    @property
    def variant(self) -> str:
        """sd-scripts' names: ``dev``/``schnell``; ``5-medium``/``5-large``/``medium``."""
        return VARIANTS[self.family]

    def config_dir(self) -> Path:
        """The shipped configs of the family (``trainer/assets/families/<family>``)."""
        return ASSETS / self.family


def _has_prefix(keys: Collection[str], prefix: str) -> bool:
    return any(k.startswith(prefix) for k in keys)


def _count(keys: Collection[str], head: str) -> int:
    """How many numbered blocks ``head.N.`` the keys hold."""
    found = {int(m.group(1)) for k in keys if (m := re.match(re.escape(head) + r"\.(\d+)\.", k))}
    return max(found) + 1 if found else 0


def refuse_other(keys: Collection[str]) -> None:
    """Name what the file is when it is not a base model in BFL's or SAI's layout."""
    if any(LORA.search(k) for k in keys):
        raise DetectionError("it is a LoRA (lora_unet_*/lora_down/lora_A keys), not a base "
                             "model; set it as network weights instead")
    if _has_prefix(keys, "single_transformer_blocks.") or _has_prefix(keys, "transformer_blocks."):
        raise DetectionError("its keys are diffusers' (transformer_blocks.*), not the original "
                             "layout: point model.pretrained_model_name_or_path at the diffusers "
                             "folder that holds it instead")
    if any("distilled_guidance_layer." in k for k in keys):
        raise DetectionError("it is Chroma (distilled_guidance_layer.*), not FLUX.1 or SD 3.x")
    raise DetectionError(f"it holds no FLUX.1 transformer ({FLUX_MARKER}) and no SD 3.x "
                         f"transformer ({DIT_PREFIX}{SD3_MARKER}); a VAE or a text encoder alone "
                         f"is not a base model")


def _transformer_prefix(keys: Collection[str], marker: str) -> Optional[str]:
    for prefix in (DIT_PREFIX, ""):
        if prefix + marker in keys:
            return prefix
    return None


def _flux_config(keys: Collection[str], shape: Shape, p: str) -> dict[str, Any]:
    """FluxTransformer2DModel's config fields that the weights show."""
    inner, in_channels = shape(p + "img_in.weight")
    head = shape(p + "double_blocks.0.img_attn.norm.query_norm.scale")[0]
    return {"in_channels": in_channels, "out_channels": shape(p + "final_layer.linear.weight")[0],
            "num_layers": _count(keys, p + "double_blocks"),
            "num_single_layers": _count(keys, p + "single_blocks"),
            "attention_head_dim": head, "num_attention_heads": inner // head,
            "joint_attention_dim": shape(p + "txt_in.weight")[1],
            "pooled_projection_dim": shape(p + "vector_in.in_layer.weight")[1],
            "guidance_embeds": p + "guidance_in.in_layer.weight" in keys, "patch_size": 1}


def _sd3_config(keys: Collection[str], shape: Shape, p: str) -> dict[str, Any]:
    """SD3Transformer2DModel's config fields that the weights show (head width 64 unless the
    QK norms say otherwise, as in every SD 3.x release)."""
    inner, in_channels, patch, _ = shape(p + "x_embedder.proj.weight")
    ln_q = p + "joint_blocks.0.x_block.attn.ln_q.weight"
    head = shape(ln_q)[0] if ln_q in keys else 64
    layers = _count(keys, p + "joint_blocks")
    dual = sorted({int(m.group(1)) for k in keys
                   if (m := re.match(re.escape(p) + r"joint_blocks\.(\d+)\.x_block\.attn2\.", k))})
    return {"in_channels": in_channels, "patch_size": patch,
            "out_channels": shape(p + "final_layer.linear.weight")[0] // (patch * patch),
            "num_layers": layers, "attention_head_dim": head, "num_attention_heads": inner // head,
            "caption_projection_dim": shape(p + "context_embedder.weight")[0],
            "joint_attention_dim": shape(p + "context_embedder.weight")[1],
            "pooled_projection_dim": shape(p + "y_embedder.mlp.0.weight")[1],
            "pos_embed_max_size": math.isqrt(shape(p + "pos_embed")[1]),
            "dual_attention_layers": dual, "qk_norm": "rms_norm" if ln_q in keys else None}


def shipped_config(family: str, component: str = "transformer") -> dict[str, Any]:
    path = ASSETS / family / component / "config.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _differences(family: str, derived: dict[str, Any]) -> list[str]:
    shipped = shipped_config(family)
    if shipped.get("out_channels") is None:  # diffusers: None means in_channels
        shipped["out_channels"] = shipped["in_channels"]
    return [f"{k} {v}" for k, v in derived.items()
            if k in shipped and (list(v) if isinstance(v, (list, tuple)) else v) != shipped[k]]


def _parts(keys: Collection[str], kind: str) -> dict[str, str]:
    """The parts besides the transformer that the file holds, with their prefixes."""
    parts = {}
    for prefix in VAE_PREFIXES:
        if prefix + VAE_MARKER in keys:
            parts["vae"] = prefix
            break
    for name in ("clip_l", "clip_g", "t5xxl") if kind == "sd3" else ("clip_l", "t5xxl"):
        if TEXT_PREFIXES[name] + TEXT_MARKERS[name] in keys:
            parts[name] = TEXT_PREFIXES[name]
    return parts


def _family(kind: str, config: dict[str, Any]) -> str:
    if kind == "flux":
        return "flux1-dev" if config["guidance_embeds"] else "flux1-schnell"
    if config["dual_attention_layers"]:
        return "sd35-medium"
    return "sd35-large" if config["qk_norm"] else "sd3-medium"


def _check_variant(kind: str, config: dict[str, Any], published: bool) -> None:
    if kind == "flux" and published is False and config["in_channels"] in (128, 384) and \
            config["num_attention_heads"] * config["attention_head_dim"] == 3072:
        what = "Depth" if config["in_channels"] == 128 else "Fill"
        raise DetectionError(f"it is FLUX.1 {what} (img_in takes {config['in_channels']} "
                             f"channels), a control model that is not trained here; use "
                             f"FLUX.1-dev or FLUX.1-schnell")


def detect_flow(keys: Collection[str], shape: Shape, dtype: Callable[[str], str]
                ) -> FlowFileInfo:
    """The family, parts and shapes of a FLUX.1 / SD 3.x file from its key names and shapes."""
    keys = set(keys)
    flux_p, sd3_p = _transformer_prefix(keys, FLUX_MARKER), _transformer_prefix(keys, SD3_MARKER)
    if flux_p is not None and flux_p + FLUX_MODULATION not in keys:
        flux_p = None  # FLUX.1's layout without its modulations: Chroma's (not FLUX.1)
    if flux_p is None and sd3_p is None:
        refuse_other(keys)
    kind, p = ("flux", flux_p) if flux_p is not None else ("sd3", sd3_p)
    config = (_flux_config if kind == "flux" else _sd3_config)(keys, shape, p)
    family = _family(kind, config)
    differences = _differences(family, config)
    _check_variant(kind, config, not differences)
    prefixes = {"transformer": p, **_parts(keys, kind)}
    weight_dtype = dtype(p + (FLUX_MARKER if kind == "flux" else SD3_MARKER))
    notes = [f"{weight_dtype} weights"]
    if differences:
        notes.append("not the published size: " + ", ".join(differences))
    inside = [part for part in REQUIRED[kind][1:] if part in prefixes]
    notes.append("with " + ", ".join(inside) + " inside" if inside else "transformer only")
    return FlowFileInfo(family, frozenset(prefixes), f"{LABELS[family]} ({'; '.join(notes)})",
                        weight_dtype, prefixes, config, not differences)


FLUX_ROPE = {128: [16, 56, 56]}  # head width -> rotary axes (FLUX.1's)


def header_config(info: FlowFileInfo) -> dict[str, Any]:
    """The transformer config of a file that is not the published size: the family's shipped
    one with the header's shapes (FLUX.1's rotary axes by head width)."""
    config = {**shipped_config(info.family), **info.transformer_config}
    if info.kind == "flux":
        rope = FLUX_ROPE.get(config["attention_head_dim"])
        if rope is None:
            raise DetectionError(f"its FLUX.1 transformer has heads {config['attention_head_dim']} "
                                 f"wide (FLUX.1: 128), so its rotary axes are unknown; set "
                                 f"model.config_dir to a folder with transformer/config.json")
        config["axes_dims_rope"] = rope
    return config


def detect_flow_file(path: str | Path) -> FlowFileInfo:
    """:func:`detect_flow` of a ``.safetensors`` file: its header only, read without torch (the
    advisor, the GUI and the doctor ask too), no weight is read; another transformer family's
    file (Chroma's) gives its own detection's facts, a record of the same fields."""
    from trainer.families import file_family
    from trainer.families.common.files import read_safetensors_header

    try:
        found = file_family(Path(path))
    except DetectionError:
        found = None
    if found is not None and isinstance(found.header, FlowFileInfo):
        return found.header
    tensors = read_safetensors_header(path).tensors
    return detect_flow(tensors.keys(), lambda k: tuple(tensors[k]["shape"]),
                       lambda k: tensors[k]["dtype"])


def is_flow_file(keys: Collection[str]) -> bool:
    """Whether the keys hold a FLUX.1 or SD 3.x transformer in the original layout (for the
    loader's choice between this module and :mod:`trainer.families.sd.detect`)."""
    keys = set(keys)
    return any(p + m in keys for p in (DIT_PREFIX, "") for m in (FLUX_MARKER, SD3_MARKER))


def holds_transformer(keys: Collection[str], marker: str) -> bool:
    """Whether the keys hold the transformer whose first block has ``marker``, bare or under
    ``model.diffusion_model.``."""
    keys = set(keys)
    return any(p + marker in keys for p in (DIT_PREFIX, ""))
