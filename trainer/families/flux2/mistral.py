"""FLUX.2 [dev]'s text encoder, Mistral-Small-3 (transformers' ``Mistral3ForConditionalGeneration``,
the class ``Flux2Pipeline`` names), from the file ComfyUI users download
(``mistral_3_small_flux2_bf16.safetensors`` / ``_fp8``: Comfy-Org/Flux-2-Dev
split_files/text_encoders/) or from our all-in-one file.

ComfyUI's file keeps the original (pre-transformers-5) names: the language model as a
``MistralForCausalLM``'s (``model.embed_tokens``, ``model.layers.N.*``, ``model.norm``,
``lm_head``), with ``vision_tower.*`` and ``multi_modal_projector.*`` beside it and the Tekken
tokenizer as a byte tensor (``tekken_model``); ComfyUI runs the language model only (layers
10, 20 and 30, ``comfy/text_encoders/flux.py``) and tells the file by
``model.layers.0.post_attention_layernorm.weight`` 5120 wide without Qwen3's ``q_norm``, 40
layers (a "pruned" file has 30). transformers 5 names the same weights
``model.language_model.*``, ``model.vision_tower.*``, ``model.multi_modal_projector.*``:
:data:`RENAMES` maps one onto the other, both ways (our all-in-one file writes ComfyUI's names
under ``text_encoders.mistral3_24b.transformer.``).

What is built: the class the pipeline names, filled a group of tensors at a time in the run's
dtype (fp8 with ``model.fp8_text_encoders`` when frozen). The vision tower and projector are
read where the file holds them and dropped where it does not (a text prompt never reaches
them); ``tekken_model`` is not read (the tokenizer is looked up as for klein). A frozen encoder
is built only as deep as the pipeline reads: 31 layers of 40 (hidden_states[30] is layer 29's
output, which the later layers cannot change; layer 30 stays so that it is not the last,
normed, state, and a folder written from the model reads back the same), so a fifth of its
weights is never loaded; a trained one is built whole. ComfyUI's "pruned" file of 30 layers is
built as it is, without the final norm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.families.flux2.conditioning import DEV_OUT_LAYERS
from trainer.families.spec import ModelLoadError

PREFIX = "text_encoders.mistral3_24b.transformer."  # in an all-in-one file
MARK = "model.layers.0.post_attention_layernorm.weight"
QWEN_MARK = "model.layers.0.self_attn.q_norm.weight"
# (ComfyUI's / the original names, transformers 5's)
RENAMES = (("model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
           ("multi_modal_projector.", "model.multi_modal_projector."), ("lm_head.", "lm_head."))
FILE = ("mistral_3_small_flux2_bf16.safetensors or mistral_3_small_flux2_fp8.safetensors "
        "(Comfy-Org/Flux-2-Dev split_files/text_encoders/)")


def _rename(key: str, pairs: Any) -> str | None:
    for old, new in pairs:
        if key.startswith(old):
            return new + key[len(old):]
    return None


def to_transformers(key: str) -> str | None:
    """A ComfyUI name's transformers-5 name (None for what is not a weight: ``tekken_model``)."""
    return _rename(key, RENAMES)


def to_comfy(key: str) -> str:
    """A transformers-5 name of ``Mistral3ForConditionalGeneration`` in ComfyUI's form."""
    found = _rename(key, [(new, old) for old, new in RENAMES[::-1]])
    if found is None:
        raise ValueError(f"text encoder weight {key!r} has no place in ComfyUI's Mistral file")
    return found


def is_mistral(entries: Any, prefix: str = "") -> bool:
    """Whether the keys hold a Mistral language model (Qwen3 has ``q_norm`` too)."""
    return prefix + MARK in entries and prefix + QWEN_MARK not in entries


def layer_count(entries: Any, prefix: str) -> int:
    start = prefix + "model.layers."
    return len({k[len(start):].split(".")[0] for k in entries if k.startswith(start)})


def _module(root: Path, layers: int, vision: bool) -> torch.nn.Module:
    from accelerate import init_empty_weights
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    config = Mistral3Config.from_pretrained(str(root / "text_encoder"))
    config.text_config.num_hidden_layers = layers
    with init_empty_weights():
        module = Mistral3ForConditionalGeneration(config)
    if not vision:  # a file of the language model alone
        module.model.vision_tower = None
        module.model.multi_modal_projector = None
    return module


def build_mistral(path: Path, setting: str, root: Path, dtype: torch.dtype, fp8: bool,
                  frozen: bool) -> torch.nn.Module:
    """``Mistral3ForConditionalGeneration`` from ``path`` (ComfyUI's file or our all-in-one)."""
    from trainer.families.common.streaming import fill_from, finish, open_reader

    where = f"{setting} = {str(path)!r}"
    reader = open_reader(path, dtype)
    prefix = next((p for p in (PREFIX, "") if is_mistral(reader.entries, p)), None)
    if prefix is None:
        raise ModelLoadError(f"{where}: no Mistral-Small-3 text encoder ({MARK} without "
                             f"q_norm) in it; FLUX.2 [dev] reads {FILE}: point {setting} "
                             f"at it")
    layers = layer_count(reader.entries, prefix)
    needed = max(DEV_OUT_LAYERS)
    if layers < needed:
        raise ModelLoadError(f"{where}: the text encoder has {layers} layers; FLUX.2 [dev] "
                             f"reads layer {needed}: point {setting} at {FILE}")
    depth = min(layers, needed + 1) if frozen else layers
    vision = prefix + "vision_tower.patch_conv.weight" in reader.entries
    module = _module(root, depth, vision)
    if depth == needed:  # hidden_states[30] is then the last layer's, which must stay unnormed
        module.model.language_model.norm = torch.nn.Identity()
    wanted = set(module.state_dict())
    keys = [k for k in reader.entries if k.startswith(prefix)
            and to_transformers(k[len(prefix):]) in wanted]
    rename = lambda tensors: {to_transformers(k): v for k, v in tensors.items()}  # noqa: E731
    module = fill_from(module, reader, keys, prefix, rename, dtype, fp8, where, "text_encoder")
    if prefix + "lm_head.weight" not in reader.entries:  # never read: the embedding stands in
        module.lm_head.weight = module.model.language_model.embed_tokens.weight
    return finish(module, dtype, fp8, where, "text_encoder")
