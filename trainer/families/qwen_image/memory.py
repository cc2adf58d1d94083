"""What the advisor needs of Qwen-Image (:mod:`trainer.advisor.flow_memory`): the release its
shipped laws are made at, the text tokens of a step, the small models of the same width whose
steps it simulates (its one kind of block), a step's inputs on the meta device, and the parts of
its split files (:mod:`trainer.advisor.host_memory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VARIANT = "base"  # the release whose configs the advisor answers for
T5_TOKENS = 512  # the text tokens of a step: the pipeline's max_sequence_length (the most)
CLIP_TOKENS = 0
TRANSFORMER_PREFIX = "QwenImage"  # diffusers' QwenImageTransformer2DModel
TRAIN_BLOCKS = ("all",)  # network.train_blocks (FLUX.1's setting; one kind of block here)
SHAPES = [(1, 0), (2, 0)]  # the small models whose difference gives one block
FIXED_BLOCKS = 0  # every block is a swap unit


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-qwen-image``)."""
    from trainer.families.qwen_image.tiny import build_components

    return build_components()


def small(config: dict, blocks: tuple[int, int]) -> dict:
    return dict(config, num_layers=blocks[0])


def extrapolate(values: list[float]) -> tuple[float, float, float]:
    """(fixed part, per block, 0) from the values of :data:`SHAPES`."""
    block = values[1] - values[0]
    return values[0] - block, block, 0.0


def image_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """The packed latents (2x2 patches of a ``w`` x ``h`` latent) and their grid."""
    tokens = (h // 2) * (w // 2)
    return dict(hidden_states=torch.zeros(batch, tokens, config["in_channels"], device="meta",
                                          dtype=torch.bfloat16),
                img_shapes=[[(1, h // 2, w // 2)]] * batch)


def step_inputs(config: dict, w: int, h: int, batch: int, text: int) -> dict[str, Any]:
    """Everything the transformer is called with in a step (no pooled text; no mask: every
    caption of the batch at the longest length)."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    return dict(image_inputs(config, w, h, batch, text),
                encoder_hidden_states=torch.zeros(batch, text, config["joint_attention_dim"],
                                                  **meta),
                timestep=torch.zeros(batch, **meta), return_dict=False)


def file_transformer_config(section: Any, path: Path) -> dict:
    """The transformer config the loader builds a Qwen-Image file with (model.config_dir's or
    the shipped one)."""
    import json

    from trainer.families.qwen_image.single_file import config_root

    root = config_root(section.config_dir, "transformer")
    return json.loads((root / "transformer" / "config.json").read_text(encoding="utf-8"))


def file_parts(section: Any, path: Path) -> dict[str, tuple[Path, str]]:
    """part -> (file, key prefix) of a Qwen-Image single file and its part files."""
    from trainer.families.qwen_image.layout import TEXT, VAE
    from trainer.families.qwen_image.single_file import file_info

    info = file_info(path)
    out: dict[str, tuple[Path, str]] = {}
    for part, setting, prefix in (("vae", section.vae, VAE),
                                  ("qwen25_7b", getattr(section, "text_encoder", None), TEXT)):
        if setting:
            out[part] = (Path(setting).expanduser(), _prefix_of(Path(setting), prefix))
        elif part in info.parts:
            out[part] = (path, prefix)
    return out


def _prefix_of(path: Path, prefix: str) -> str:
    """A part file's prefix: ComfyUI's all-in-one one where its keys have it, else none."""
    from trainer.families.common.files import read_safetensors_header

    try:
        keys = read_safetensors_header(path).tensors
    except Exception:  # noqa: BLE001 - an unreadable file counts as nothing here
        return prefix
    return prefix if any(k.startswith(prefix) for k in keys) else ""


# --- edit training: what Qwen2.5-VL's reading of the control images adds -----------------------
# "Picture N: " before each image in the Plus template (2509, 2511): Qwen2's pre-tokenizer
# splits it into "Picture", " ", the digit, ":", " " (the image markers are special tokens);
# the vision start and end tokens around each image's pads in both templates
PICTURE_TOKENS = 5
MARKER_TOKENS = 2


def edit_variant(section: Any) -> str:
    """The edit variant of ``section``'s model: a diffusers folder's pipeline (2511 by its
    transformer's ``zero_cond_t``), a single file's header; Edit where neither tells."""
    import json

    from trainer.families import detect_path
    from trainer.families.qwen_image.detect import folder_variant

    path = _root(section)
    try:
        if path.is_dir():
            index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
            config = path / "transformer" / "config.json"
            transformer = json.loads(config.read_text(encoding="utf-8")) \
                if config.is_file() else {}
            return folder_variant(index, transformer)
        variant = getattr(detect_path(path).header, "variant", None)
    except (OSError, ValueError):
        variant = None
    return variant if variant and variant.startswith("edit") else "edit"


def text_side(variant: str, size: tuple[int, int]) -> tuple[int, int]:
    """The size the text encoder reads a control of ``size`` at: Edit's pipeline passes it
    as its latents have it, Plus (2509, 2511) at about 384 x 384 (edit.py)."""
    from trainer.families.qwen_image.edit import condition_size

    return size if variant == "edit" else condition_size(*size)


def _root(section: Any) -> Path:
    """The model's folder or file (the embedded twin's folder, where a run has built it)."""
    from trainer.models.loader import EMBEDDED_MODELS

    value = section.pretrained_model_name_or_path
    if value in EMBEDDED_MODELS:
        from trainer.config.paths import data_home

        return data_home() / "embedded" / value.split(":", 1)[1]
    return Path(value).expanduser()


def _own_config(section: Any, part: str, name: str) -> dict:
    """``part/name`` of ``section``'s model folder (the embedded twin's where a run built it),
    else the shipped one of Qwen-Image's release (every edit model's is the same)."""
    import json

    from trainer.families import spec

    own = _root(section) / part / name
    path = own if own.is_file() else spec("qwen_image").assets(VARIANT) / part / name
    return json.loads(path.read_text(encoding="utf-8"))


def vision_tokens(size: tuple[int, int], processor: dict) -> int:
    """The image pads the processor (its ``preprocessor_config.json``) puts in the prompt for
    an image of ``size`` (width, height): its ``smart_resize`` to multiples of the merged
    patch within its pixel bounds, one token per merge of patches."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    patch, merge = processor["patch_size"], processor["merge_size"]
    h, w = smart_resize(size[1], size[0], factor=patch * merge,
                        min_pixels=processor["min_pixels"], max_pixels=processor["max_pixels"])
    return (h // patch) * (w // patch) // (merge * merge)


def control_text(section: Any, sizes: list[tuple[int, int]], c: int) -> tuple[int, int, str]:
    """What the text encoder's reading of the controls (trained at ``sizes``) adds: (tokens to
    the text sequence the transformer reads, bytes while the captions are encoded at ``c``
    bytes a value, a line's words). The pads, the vision markers (and Plus's "Picture N: ")
    stay in the hidden states after the template's first 64 tokens, so the transformer's
    text grows by them. While encoding, the language model keeps every layer's hidden states
    of those tokens (``output_hidden_states``) and their logits (the pipeline's
    ``Qwen2_5_VLForConditionalGeneration``), and one layer's feed-forward; the vision tower
    one layer's tensors of the image's 14 px patches (its layers run one at a time, without
    gradients)."""
    variant = edit_variant(section)
    config = _own_config(section, "text_encoder", "config.json")
    processor = _own_config(section, "processor", "preprocessor_config.json")
    text, vision = config.get("text_config", config), config["vision_config"]
    pads = [vision_tokens(text_side(variant, s), processor) for s in sizes]
    extra = MARKER_TOKENS + (0 if variant == "edit" else PICTURE_TOKENS)
    tokens = sum(pads) + extra * len(sizes)
    per_token = (text["num_hidden_layers"] + 1) * text["hidden_size"] + text["vocab_size"] \
        + 3 * text["intermediate_size"]
    patches = max(pads, default=0) * vision["spatial_merge_size"] ** 2
    tower = patches * (4 * vision["hidden_size"] + 3 * vision["intermediate_size"])
    sides = ", ".join(f"{w}x{h}" for w, h in (text_side(variant, s) for s in sizes))
    return tokens, c * (tokens * per_token + tower), (
        f"Qwen2.5-VL reading the control image(s) at {sides} px: {tokens} more tokens")
