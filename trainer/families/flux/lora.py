"""FLUX.1 LoRA: which diffusers modules train, and the file in sd-scripts' kohya form.

We train peft LoRA on diffusers' ``FluxTransformer2DModel``; the file names the modules by Black
Forest Labs' original layout, as sd-scripts' ``networks/lora_flux.py`` writes them and ComfyUI
(``lora_unet_`` + the BFL path), diffusers' ``FluxPipeline.load_lora_weights``
(``_convert_kohya_flux_lora_to_diffusers``) and sd-scripts read them::

    lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight  [R, in]
    lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight    [out, R]
    lora_unet_double_blocks_0_img_attn_qkv.alpha             0-d: update = up @ down * alpha / R

The name map (docs/flow_families_plan.md, checked against sd-scripts' ``flux_models.py`` and
diffusers' ``convert_flux_transformer_checkpoint_to_diffusers``) is :data:`DOUBLE_PARTS` and
:data:`SINGLE_PARTS`. Where BFL has one fused Linear and diffusers splits it (``img_attn.qkv`` =
``to_q``/``to_k``/``to_v``; ``linear1`` = ``to_q``/``to_k``/``to_v``/``proj_mlp``), the file holds
the fused module's LoRA (:func:`fuse_lora`): ``lora_down`` is the parts' ``lora_A`` stacked on
the rank axis, ``lora_up`` their ``lora_B`` placed block-diagonally (part i's rows, part i's rank
columns), and ``alpha`` = scale x R, so ``alpha / R`` is each part's ``alpha / r``. That is the
same update, exactly; diffusers splits it back into per-part LoRAs when the blocks are equal and
sparse, and gives every part the whole ``lora_down`` otherwise, which is also exact.

Text encoders as sd-scripts names them: ``lora_te1_`` CLIP-L (``text_model.encoder...``),
``lora_te3_`` T5-XXL (``encoder.block...``). diffusers' FLUX loader keeps ``lora_te1_`` and drops
T5 keys; ComfyUI loads both.

LyCORIS (LoCon, LoHa, LoKr) cannot be fused so: ``kron`` or Hadamard products on to_q, to_k and
to_v make no such product on ``img_attn.qkv``. Its file names each diffusers layer
(:func:`lycoris_module_name`: ``lycoris_transformer_blocks_0_attn_to_q``), which ComfyUI's FLUX
branch (``flux_to_diffusers``) maps onto that layer's rows of the BFL weight, and its LoRA /
LoHa / LoKr adapters patch there; trainer/export/flow_lycoris.py has the details.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, Literal, Optional

import torch

from trainer.export.lora import (
    _check_exportable,
    iter_lora_layers,
    module_lora_tensors,
)
from trainer.export.names import kohya_module_name, text_encoder_module_path, unwrap

UNET_PREFIX = "lora_unet"
CLIP_L_PREFIX = "lora_te1"  # sd-scripts' LORA_PREFIX_TEXT_ENCODER_CLIP
T5_PREFIX = "lora_te3"  # sd-scripts' LORA_PREFIX_TEXT_ENCODER_T5 ("make ComfyUI compatible")

# BFL part of a DoubleStreamBlock (kohya name without the block prefix) -> diffusers modules of
# transformer_blocks.N, in the fused module's row order.
DOUBLE_PARTS: dict[str, tuple[str, ...]] = {
    "img_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "img_attn_proj": ("attn.to_out.0",),
    "img_mlp_0": ("ff.net.0.proj",),
    "img_mlp_2": ("ff.net.2",),
    "img_mod_lin": ("norm1.linear",),
    "txt_attn_qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "txt_attn_proj": ("attn.to_add_out",),
    "txt_mlp_0": ("ff_context.net.0.proj",),
    "txt_mlp_2": ("ff_context.net.2",),
    "txt_mod_lin": ("norm1_context.linear",),
}
# SingleStreamBlock: linear1's rows are q, k, v (3 x hidden) then the MLP's input (mlp hidden).
SINGLE_PARTS: dict[str, tuple[str, ...]] = {
    "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
    "linear2": ("proj_out",),
    "modulation_lin": ("norm.linear",),
}
# sd-scripts' ``in_dims`` (off by default): the embedders outside the blocks.
EMBEDDER_PARTS: dict[str, str] = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in_in_layer": "time_text_embed.timestep_embedder.linear_1",
    "time_in_out_layer": "time_text_embed.timestep_embedder.linear_2",
    "vector_in_in_layer": "time_text_embed.text_embedder.linear_1",
    "vector_in_out_layer": "time_text_embed.text_embedder.linear_2",
    "guidance_in_in_layer": "time_text_embed.guidance_embedder.linear_1",
    "guidance_in_out_layer": "time_text_embed.guidance_embedder.linear_2",
}
# sd-scripts wraps every Linear of CLIPAttention / CLIPMLP and T5Attention / T5DenseGatedActDense.
CLIP_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
T5_TARGETS = ["q", "k", "v", "o", "wi_0", "wi_1", "wo"]

TrainBlocks = Literal["all", "single", "double"]


def _block_count(transformer: torch.nn.Module, name: str) -> int:
    pattern = re.compile(rf"^{name}\.(\d+)$")
    found = [int(m.group(1)) for n, _ in unwrap(transformer).named_modules()
             if (m := pattern.match(n))]
    return max(found) + 1 if found else 0


def flux_part_modules(transformer: torch.nn.Module, train_blocks: TrainBlocks = "all",
                      parts: Optional[Iterable[str]] = None,
                      in_dims: bool = False) -> dict[str, tuple[str, ...]]:
    """BFL module path (``double_blocks.0.img_attn.qkv`` as kohya writes it, underscored) ->
    the diffusers module paths it covers, for the blocks ``train_blocks`` picks (sd-scripts'
    ``train_blocks``) and the BFL ``parts`` named (default all; e.g. leave out ``"linear1"``)."""
    if train_blocks not in ("all", "single", "double"):
        raise ValueError(f"train_blocks={train_blocks!r}: use 'all', 'single' or 'double' "
                         "(sd-scripts' network_args train_blocks)")
    chosen = set(parts) if parts is not None else None
    known = set(DOUBLE_PARTS) | set(SINGLE_PARTS) | set(EMBEDDER_PARTS)
    if chosen is not None and chosen - known:
        raise ValueError(f"unknown FLUX.1 LoRA parts {sorted(chosen - known)}; "
                         f"the parts are {sorted(known)}")
    out: dict[str, tuple[str, ...]] = {}
    for kind, block, table in (("double", "transformer_blocks", DOUBLE_PARTS),
                               ("single", "single_transformer_blocks", SINGLE_PARTS)):
        if train_blocks not in ("all", kind):
            continue
        for n in range(_block_count(transformer, block)):
            for part, modules in table.items():
                if chosen is None or part in chosen:
                    out[f"{kind}_blocks_{n}_{part}"] = tuple(f"{block}.{n}.{m}" for m in modules)
    if in_dims:
        for part, module in EMBEDDER_PARTS.items():
            if chosen is None or part in chosen:
                out[part] = (module,)
    existing = {n for n, _ in unwrap(transformer).named_modules()}
    return {k: tuple(m for m in v if m in existing) for k, v in out.items()
            if any(m in existing for m in v)}


def flux_target_modules(transformer: torch.nn.Module, train_blocks: TrainBlocks = "all",
                        parts: Optional[Iterable[str]] = None, in_dims: bool = False) -> list[str]:
    """The diffusers module paths to give peft as ``LoraConfig(target_modules=...)``: full
    paths, which peft matches exactly, so ``to_q`` of a double block and of a single block are
    told apart (a bare suffix would pick both)."""
    modules = flux_part_modules(transformer, train_blocks, parts, in_dims)
    return sorted({m for group in modules.values() for m in group})


def _out_features(transformer: torch.nn.Module, path: str) -> int:
    module = unwrap(transformer).get_submodule(path)
    return int(getattr(module, "out_features", None) or module.weight.shape[0])


def fuse_lora(parts: list[tuple[Optional[Any], int]], adapter_name: str = "default") -> tuple[
        torch.Tensor, torch.Tensor, float]:
    """(down, up, alpha) of one fused Linear from its parts' peft layers, in float32.

    ``parts``: (peft LoraLayer or None if that part did not train, its output rows), in the
    fused weight's row order. ``down`` stacks the ``lora_A`` on the rank axis, ``up`` is
    block-diagonal, ``alpha / R`` is the parts' scale; parts with different scales get their
    own scale folded into their ``up`` block and ``alpha = R``.
    """
    trained = [(layer, rows) for layer, rows in parts if layer is not None]
    if not trained:
        raise ValueError("fuse_lora: none of the parts has a LoRA layer")
    downs = [layer.lora_A[adapter_name].weight.detach().float() for layer, _ in trained]
    scales = [float(layer.scaling[adapter_name]) for layer, _ in trained]
    same = all(math.isclose(s, scales[0], rel_tol=1e-6) for s in scales)
    rank = sum(d.shape[0] for d in downs)
    up = torch.zeros(sum(rows for _, rows in parts), rank, dtype=torch.float32,
                     device=downs[0].device)
    row = col = 0
    for layer, rows in parts:
        if layer is not None:
            b = layer.lora_B[adapter_name].weight.detach().float()
            s = 1.0 if same else float(layer.scaling[adapter_name])
            up[row:row + rows, col:col + b.shape[1]] = b * s
            col += b.shape[1]
        row += rows
    return torch.cat(downs, dim=0), up, (scales[0] if same else 1.0) * rank


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=dtype).contiguous()


def flux_transformer_tensors(transformer: torch.nn.Module, *, dtype: torch.dtype = torch.float16,
                             adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The kohya tensors of a peft-adapted FluxTransformer2DModel under BFL names."""
    layers = dict(iter_lora_layers(transformer, adapter_name))
    for name, layer in layers.items():
        _check_exportable(name, layer, adapter_name)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for bfl, modules in flux_part_modules(transformer, in_dims=True).items():
        if not any(m in layers for m in modules):
            continue
        parts = [(layers.get(m), _out_features(transformer, m)) for m in modules]
        down, up, alpha = fuse_lora(parts, adapter_name)
        key = kohya_module_name(UNET_PREFIX, bfl)
        out[key + ".lora_down.weight"] = _cast(down, dtype)
        out[key + ".lora_up.weight"] = _cast(up, dtype)
        out[key + ".alpha"] = torch.tensor(alpha, dtype=dtype)
        used.update(modules)
    left = sorted(set(layers) - used)
    if left:
        raise ValueError(f"LoRA on {left[:5]} has no name in the FLUX.1 (BFL) layout that "
                         "sd-scripts, ComfyUI and diffusers read; train only the modules of "
                         "flux_target_modules()")
    return out


def flux_kohya_state_dict(transformer: Optional[torch.nn.Module],
                          text_encoder: Optional[torch.nn.Module] = None,
                          text_encoder_3: Optional[torch.nn.Module] = None, *,
                          dtype: torch.dtype = torch.float16,
                          adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """A FLUX.1 LoRA in sd-scripts' kohya form: the transformer under BFL names
    (``lora_unet_``), CLIP-L ``text_encoder`` as ``lora_te1_``, T5 ``text_encoder_3`` (the
    FluxPipeline's ``text_encoder_2``; sd-scripts counts T5 third) as ``lora_te3_``."""
    tensors: dict[str, torch.Tensor] = {}
    if transformer is not None:
        tensors.update(flux_transformer_tensors(transformer, dtype=dtype,
                                                adapter_name=adapter_name))
    if text_encoder is not None:
        tensors.update(module_lora_tensors(text_encoder, CLIP_L_PREFIX, dtype=dtype,
                                           adapter_name=adapter_name,
                                           rename=text_encoder_module_path))
    if text_encoder_3 is not None:
        tensors.update(module_lora_tensors(text_encoder_3, T5_PREFIX, dtype=dtype,
                                           adapter_name=adapter_name))
    if not tensors:
        raise ValueError(f"no LoRA layers with adapter {adapter_name!r} to save")
    return tensors


# --- the run's LoRA (trainer/methods/lora.py, flow_lora.py): the questions every transformer
# family's lora role answers


def target_modules(transformer: torch.nn.Module, train_blocks: TrainBlocks = "all") -> list[str]:
    """The transformer's LoRA targets for ``network.train_blocks``."""
    return flux_target_modules(transformer, train_blocks)


def run_state_dict(transformer: Optional[torch.nn.Module], encoders: dict[str, Any],
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The run's LoRA file tensors; ``encoders``: the trained text encoders by attribute."""
    return flux_kohya_state_dict(transformer, encoders.get("text_encoder"),
                                 encoders.get("text_encoder_2"), dtype=dtype)


def lycoris_module_name(component: str, path: str) -> str:
    """A LyCORIS file's name of a trained module (trainer/export/flow_lycoris.py): the
    transformer's by its diffusers path (``lycoris_transformer_blocks_0_attn_to_q``, which
    ComfyUI maps onto its rows of BFL's fused ``img_attn.qkv``), CLIP-L and T5 as the LoRA
    names them (``lora_te1_``, ``lora_te3_``)."""
    from trainer.export.flow_lycoris import TRANSFORMER, diffusers_lycoris_name

    if component == TRANSFORMER:
        return diffusers_lycoris_name(path)
    if component == "text_encoder":
        return kohya_module_name(CLIP_L_PREFIX, text_encoder_module_path(path))
    if component == "text_encoder_2":
        return kohya_module_name(T5_PREFIX, path)
    raise ValueError(f"FLUX.1 has no component {component!r} for a LyCORIS file")


def file_metadata(info: Any) -> dict[str, str]:
    """What a FLUX.1 Kontext LoRA's metadata says beside the run's keys (FLUX.1's own are
    trainer/families/common/mmdit_lora_file.py's): FLUX.1's file form and version (``flux1``,
    ``networks.lora_flux``: musubi-tuner trains Kontext with that module and ComfyUI, diffusers
    and sd-scripts read the file as FLUX.1's), the architecture naming Kontext."""
    from trainer.families.common.mmdit_lora_file import FLUX_NETWORK_MODULE, FLUX_VERSION, IMPL_FLUX

    return {"ss_base_model_version": FLUX_VERSION, "ss_network_module": FLUX_NETWORK_MODULE,
            "modelspec.architecture": f"flux-1-kontext-{info.variant}/lora",
            "modelspec.implementation": IMPL_FLUX}
