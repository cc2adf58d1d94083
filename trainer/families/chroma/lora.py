"""Chroma LoRA: which diffusers modules train, and the file in sd-scripts' kohya form.

We train peft LoRA on diffusers' ``ChromaTransformer2DModel``; the file names the modules by
Black Forest Labs' layout, as sd-scripts' ``networks/lora_flux.py`` writes a Chroma LoRA
(``--model_type chroma``: every Linear of ``DoubleStreamBlock`` / ``SingleStreamBlock``, prefix
``lora_unet``), which ComfyUI (``model_base.Chroma`` is a ``Flux``: ``lora_unet_`` + the BFL
path) and diffusers' ``ChromaPipeline.load_lora_weights`` (``FluxLoraLoaderMixin``: any
``.lora_down.weight`` goes through ``_convert_kohya_flux_lora_to_diffusers``) read::

    lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight  [R, in]
    lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight    [out, R]
    lora_unet_double_blocks_0_img_attn_qkv.alpha             0-d: update = up @ down * alpha / R

Chroma's blocks are FLUX.1's without their modulation Linear layers (the approximator outside
the blocks makes the modulations): :data:`DOUBLE_PARTS`, :data:`SINGLE_PARTS`. A fused BFL
layer (``img_attn.qkv`` = ``to_q``/``to_k``/``to_v``; ``linear1`` = q, k, v and ``proj_mlp``)
holds the fused module's LoRA (:func:`fuse_lora`): ``lora_down`` the parts' ``lora_A`` stacked
on the rank axis, ``lora_up`` their ``lora_B`` block-diagonal, ``alpha`` = scale x R: the same
update, exactly. T5 (the pipeline's only text encoder) is named ``lora_te1_`` + its
transformers path: ComfyUI numbers the text encoders it holds, and Chroma's first and only is
T5 (``comfy/lora.py``'s ``t5xxl.transformer.`` keys -> ``lora_te1_``; sd-scripts' ``lora_te3_``
T5 keys are "not loaded" there). diffusers' FLUX converter reads ``lora_te1_`` as CLIP-L and
refuses such a file (and drops ``lora_te3_``): a LoRA for diffusers trains the transformer
alone, which is the default (``network.train_text_encoder`` off).
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

import torch

from trainer.export.lora import _check_exportable, iter_lora_layers, module_lora_tensors
from trainer.export.names import kohya_module_name, unwrap
from trainer.families.common.lora_forms import (
    Fused,
    fuse_parts,
    fused_units,
    kohya_form,
    split_units,
)
from trainer.families.common.lora_fuse import fuse_factors, layer_factors

UNET_PREFIX = "lora_unet"
T5_PREFIX = "lora_te1"  # ComfyUI's name of Chroma's T5 (its first text encoder)
SD_SCRIPTS_T5_PREFIX = "lora_te3"  # sd-scripts' lora_flux writes T5 so for Chroma too
# BFL part of a DoubleStreamBlock -> diffusers modules of transformer_blocks.N, in row order
DOUBLE_PARTS: dict[str, tuple[str, ...]] = {
    "img_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "img_attn_proj": ("attn.to_out.0",),
    "img_mlp_0": ("ff.net.0.proj",),
    "img_mlp_2": ("ff.net.2",),
    "txt_attn_qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "txt_attn_proj": ("attn.to_add_out",),
    "txt_mlp_0": ("ff_context.net.0.proj",),
    "txt_mlp_2": ("ff_context.net.2",),
}
# SingleStreamBlock: linear1's rows are q, k, v (3 x hidden) then the MLP's input
SINGLE_PARTS: dict[str, tuple[str, ...]] = {
    "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
    "linear2": ("proj_out",),
}
# sd-scripts' in_dims (off by default): the embedders Chroma has
EMBEDDER_PARTS: dict[str, str] = {"img_in": "x_embedder", "txt_in": "context_embedder"}
T5_TARGETS = ["q", "k", "v", "o", "wi_0", "wi_1", "wo"]  # T5Attention, T5DenseGatedActDense

TrainBlocks = Literal["all", "single", "double"]


def _block_count(transformer: torch.nn.Module, name: str) -> int:
    pattern = re.compile(rf"^{name}\.(\d+)$")
    found = [int(m.group(1)) for n, _ in unwrap(transformer).named_modules()
             if (m := pattern.match(n))]
    return max(found) + 1 if found else 0


def part_modules(transformer: torch.nn.Module, train_blocks: TrainBlocks = "all",
                 in_dims: bool = False) -> dict[str, tuple[str, ...]]:
    """BFL module name (``double_blocks_0_img_attn_qkv``, kohya's underscores) -> the diffusers
    module paths it covers, for the blocks ``train_blocks`` picks (sd-scripts' option)."""
    if train_blocks not in ("all", "single", "double"):
        raise ValueError(f"network.train_blocks = {train_blocks!r}: use 'all', 'single' or "
                         "'double' (sd-scripts' network_args train_blocks)")
    out: dict[str, tuple[str, ...]] = {}
    for kind, block, table in (("double", "transformer_blocks", DOUBLE_PARTS),
                               ("single", "single_transformer_blocks", SINGLE_PARTS)):
        if train_blocks in ("all", kind):
            for n in range(_block_count(transformer, block)):
                for part, modules in table.items():
                    out[f"{kind}_blocks_{n}_{part}"] = tuple(f"{block}.{n}.{m}" for m in modules)
    if in_dims:
        out.update({part: (module,) for part, module in EMBEDDER_PARTS.items()})
    return out


def target_modules(transformer: torch.nn.Module, train_blocks: TrainBlocks = "all") -> list[str]:
    """The diffusers module paths peft wraps (``LoraConfig(target_modules=...)``, full paths,
    which peft matches exactly) for ``network.train_blocks``."""
    modules = part_modules(transformer, train_blocks)
    return sorted({m for group in modules.values() for m in group})


def fuse_lora(parts: list[tuple[Optional[Any], int]], adapter_name: str = "default"
              ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of one fused Linear from its parts' peft layers (or None for a part
    that did not train) with their output rows, in the fused weight's row order; parts of
    different scales get their own folded into their ``up`` block and ``alpha = R``
    (:func:`trainer.families.common.lora_fuse.fuse_factors`)."""
    return fuse_factors([(layer_factors(layer, adapter_name), rows) for layer, rows in parts])


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=dtype).contiguous()


def transformer_tensors(transformer: torch.nn.Module, *, dtype: torch.dtype = torch.float16,
                        adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The kohya tensors of a peft-adapted ChromaTransformer2DModel under BFL names."""
    layers = dict(iter_lora_layers(transformer, adapter_name))
    for name, layer in layers.items():
        _check_exportable(name, layer, adapter_name)
    root = unwrap(transformer)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for bfl, modules in part_modules(transformer, in_dims=True).items():
        if not any(m in layers for m in modules):
            continue
        parts = [(layers.get(m), root.get_submodule(m).out_features) for m in modules]
        down, up, alpha = fuse_lora(parts, adapter_name)
        key = kohya_module_name(UNET_PREFIX, bfl)
        out[key + ".lora_down.weight"] = _cast(down, dtype)
        out[key + ".lora_up.weight"] = _cast(up, dtype)
        out[key + ".alpha"] = torch.tensor(alpha, dtype=dtype)
        used.update(modules)
    left = sorted(set(layers) - used)
    if left:
        raise ValueError(f"LoRA on {left[:5]} has no name in Chroma's (BFL) layout that "
                         "sd-scripts, ComfyUI and diffusers read; train only the modules of "
                         "target_modules()")
    return out


def run_state_dict(transformer: Optional[torch.nn.Module], encoders: dict[str, Any],
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The run's LoRA file tensors; ``encoders``: the trained text encoders by attribute
    (Chroma's T5 is ``text_encoder``)."""
    tensors: dict[str, torch.Tensor] = {}
    if transformer is not None:
        tensors.update(transformer_tensors(transformer, dtype=dtype))
    if encoders.get("text_encoder") is not None:
        tensors.update(module_lora_tensors(encoders["text_encoder"], T5_PREFIX, dtype=dtype))
    if not tensors:
        raise ValueError("no LoRA layers to save")
    return tensors


# --- LyCORIS (trainer/export/flow_lycoris.py) ----------------------------------------------------


def lycoris_module_name(component: str, path: str) -> str:
    """A LyCORIS file's name of a trained module: the transformer's ``lycoris_`` + its diffusers
    path, which ComfyUI's Flux branch maps for Chroma (its ``Chroma`` model is a ``Flux``;
    ``flux_to_diffusers``): q / k / v onto their rows of ``img_attn.qkv``, ``txt_attn.qkv`` or
    a single block's ``linear1``, ``proj_mlp`` onto ``linear1``'s MLP rows, the rest whole; T5
    as its LoRA names it (``lora_te1_``, ComfyUI's name of Chroma's first text encoder)."""
    from trainer.export.flow_lycoris import TRANSFORMER, diffusers_lycoris_name

    if component == TRANSFORMER:
        return diffusers_lycoris_name(path)
    if component == "text_encoder":
        return kohya_module_name(T5_PREFIX, path)
    raise ValueError(f"Chroma has no component {component!r} for a LyCORIS file")


def file_metadata(info: Any) -> dict[str, str]:
    """What a Chroma LoRA's metadata says beside the run's keys, as sd-scripts'
    ``flux_train_network.py`` with ``--model_type chroma`` writes it (``ss_model_type``,
    ``ss_base_model_version`` ``chroma``, ``modelspec.architecture`` ``chroma/lora``,
    ``modelspec.implementation`` lodestones' repository); the T5 mask is always applied."""
    from trainer.families.chroma.checkpoint import ARCHITECTURE, IMPLEMENTATION

    return {"ss_model_type": "chroma", "ss_apply_t5_attn_mask": "True",
            "ss_base_model_version": "chroma", "ss_network_module": "networks.lora_flux",
            "modelspec.architecture": f"{ARCHITECTURE}/lora",
            "modelspec.implementation": IMPLEMENTATION}


# --- the peers' files: network.network_weights and the tools ------------------------------------
# linear1's rows: q, k, v of the block's width (its input), then the MLP's input (4 x)
FUSED = (Fused("double_blocks", "transformer_blocks", fused_units(DOUBLE_PARTS)),
         Fused("single_blocks", "single_transformer_blocks",
               fused_units(SINGLE_PARTS, {"proj_mlp": 4})))


def network_weights_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Chroma LoRA file's tensors as one LoRA per layer, under :func:`network_module_name`'s
    names (what :mod:`trainer.methods.lora_weights` loads): ours and sd-scripts' BFL kohya
    names (fused layers split: block-diagonal by their rank columns, dense with the whole
    ``lora_down``), ai-toolkit's ``diffusion_model.<BFL path>`` and the diffusers form's
    ``transformer.<path>`` (scale 1); T5 as ours (``lora_te1_``) or sd-scripts' (``lora_te3_``)
    names it."""
    out = split_units(kohya_form(tensors), FUSED)
    t5 = SD_SCRIPTS_T5_PREFIX + "_"
    return {T5_PREFIX + "_" + k[len(t5):] if k.startswith(t5) else k: v for k, v in out.items()}


def network_module_name(component: str, path: str) -> str:
    """The name a continued network's layer reads its tensors under: the transformer's
    ``lora_unet_`` + its diffusers path, T5's (``text_encoder``) ``lora_te1_`` + its path."""
    return kohya_module_name(T5_PREFIX if component == "text_encoder" else UNET_PREFIX, path)


def own_form_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Chroma LoRA file of any writer in this family's own form (sd-scripts' BFL kohya names
    with alpha, split layers fused block-diagonally): what resize writes."""
    return fuse_parts(kohya_form(tensors), FUSED)
