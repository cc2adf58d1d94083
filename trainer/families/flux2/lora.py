"""FLUX.2 LoRA: which diffusers modules train, and the file in the form ComfyUI and diffusers
both load.

**What trains** (musubi-tuner's ``networks/lora_flux_2.py``: every Linear of the double and
single stream blocks but the norms): in a double block the image and text attention's q/k/v
and output and their gated MLPs, in a single block ``linear1`` (q, k, v and the MLP's input,
one Linear in diffusers too: ``attn.to_qkv_mlp_proj``) and ``linear2`` (``attn.to_out``). The
shared modulations and the embedders sit outside the blocks and do not train.
``network.train_blocks`` picks ``single`` or ``double`` blocks only (sd-scripts' FLUX.1 option).

**The file** names the modules by Black Forest Labs' layout in kohya form, as musubi-tuner
writes them::

    lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight   [3R, hidden]
    lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight     [3 hidden, 3R]  block-diagonal
    lora_unet_double_blocks_0_img_attn_qkv.alpha              update = up @ down * alpha / 3R
    lora_unet_double_blocks_0_img_mlp_0.*                     (diffusers' ff.linear_in)
    lora_unet_single_blocks_0_linear1.*                       (attn.to_qkv_mlp_proj)

Why this form: ComfyUI maps ``lora_unet_`` + every BFL weight's path with dots as underscores
(``comfy/lora.py`` ``model_lora_keys_unet``; FLUX.2's model is BFL's, ``double_blocks.0.img_attn
.qkv`` fused), and diffusers' ``Flux2KleinPipeline.load_lora_weights``
(``_convert_kohya_flux2_lora_to_diffusers``) reads the same names, splitting a block-diagonal
``qkv`` back into exact per-part LoRAs and baking ``alpha / rank`` in.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import torch

from trainer.export.lora import _check_exportable, iter_lora_layers
from trainer.export.names import kohya_module_name, unwrap
from trainer.families.common.lora_forms import (
    Fused,
    fuse_parts,
    fused_units,
    kohya_form,
    split_units,
)
from trainer.families.common.lora_fuse import fuse

UNET_PREFIX = "lora_unet"
# BFL part (kohya name after the block) -> the diffusers modules it covers, in row order
# (diffusers' convert_flux2_transformer_checkpoint_to_diffusers)
DOUBLE_PARTS: dict[str, tuple[str, ...]] = {
    "img_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "img_attn_proj": ("attn.to_out.0",),
    "img_mlp_0": ("ff.linear_in",),
    "img_mlp_2": ("ff.linear_out",),
    "txt_attn_qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "txt_attn_proj": ("attn.to_add_out",),
    "txt_mlp_0": ("ff_context.linear_in",),
    "txt_mlp_2": ("ff_context.linear_out",),
}
SINGLE_PARTS: dict[str, tuple[str, ...]] = {
    "linear1": ("attn.to_qkv_mlp_proj",),
    "linear2": ("attn.to_out",),
}
BLOCKS = (("double", "transformer_blocks", DOUBLE_PARTS),
          ("single", "single_transformer_blocks", SINGLE_PARTS))
BASE_MODEL_VERSION = "flux2"  # ss_base_model_version (the spec's kohya_version)


def block_count(transformer: torch.nn.Module, block: str) -> int:
    pattern = re.compile(rf"^{block}\.(\d+)$")
    found = [int(m.group(1)) for n, _ in unwrap(transformer).named_modules()
             if (m := pattern.match(n))]
    return max(found) + 1 if found else 0


def part_modules(transformer: torch.nn.Module, train_blocks: str = "all"
                 ) -> dict[str, tuple[str, ...]]:
    """BFL kohya name without the prefix (``double_blocks_0_img_attn_qkv``) -> the diffusers
    paths it covers, for the blocks ``train_blocks`` (``all``, ``single``, ``double``) picks."""
    if train_blocks not in ("all", "single", "double"):
        raise ValueError(f"network.train_blocks = {train_blocks!r}: use 'all', 'single' or "
                         f"'double'")
    out = {}
    for kind, block, table in BLOCKS:
        if train_blocks not in ("all", kind):
            continue
        for n in range(block_count(transformer, block)):
            for part, modules in table.items():
                out[f"{kind}_blocks_{n}_{part}"] = tuple(f"{block}.{n}.{m}" for m in modules)
    return out


def bfl_path(name: str) -> str:
    """``double_blocks_0_img_attn_qkv`` -> ``double_blocks.0.img_attn.qkv`` (BFL's module)."""
    kind, _, n, part = name.split("_", 3)
    bfl = {"img_attn_qkv": "img_attn.qkv", "img_attn_proj": "img_attn.proj",
           "img_mlp_0": "img_mlp.0", "img_mlp_2": "img_mlp.2", "txt_attn_qkv": "txt_attn.qkv",
           "txt_attn_proj": "txt_attn.proj", "txt_mlp_0": "txt_mlp.0",
           "txt_mlp_2": "txt_mlp.2"}.get(part, part)
    return f"{kind}_blocks.{n}.{bfl}"


def target_modules(transformer: torch.nn.Module, train_blocks: str = "all") -> list[str]:
    """The diffusers module paths peft wraps (full paths: matched exactly)."""
    return sorted(m for group in part_modules(transformer, train_blocks).values()
                  for m in group)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=dtype).contiguous()


def kohya_tensors(transformer: torch.nn.Module, dtype: torch.dtype = torch.bfloat16,
                  adapter: str = "default") -> dict[str, torch.Tensor]:
    """The file's tensors of a peft-adapted ``Flux2Transformer2DModel`` (BFL kohya names)."""
    layers = dict(iter_lora_layers(transformer, adapter))
    for name, layer in layers.items():
        _check_exportable(name, layer, adapter)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for bfl, modules in part_modules(transformer).items():
        present = [m for m in modules if m in layers]
        if not present:
            continue
        if len(present) != len(modules):
            raise ValueError(f"LoRA on {present} but not on all of {list(modules)}: the fused "
                             f"{bfl_path(bfl)} of the file needs all of them")
        rows = [unwrap(transformer).get_submodule(m).out_features for m in modules]
        down, up, alpha = fuse([layers[m] for m in modules], rows, adapter)
        key = kohya_module_name(UNET_PREFIX, bfl)
        out[key + ".lora_down.weight"] = _cast(down, dtype)
        out[key + ".lora_up.weight"] = _cast(up, dtype)
        out[key + ".alpha"] = torch.tensor(alpha, dtype=dtype)
        used.update(modules)
    left = sorted(set(layers) - used)
    if left:
        raise ValueError(f"LoRA on {left[:5]} has no name in FLUX.2's BFL layout; train only "
                         f"the modules of target_modules()")
    return out


def run_state_dict(transformer: Optional[torch.nn.Module], encoders: dict[str, Any],
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The run's LoRA file tensors (the transformer's; FLUX.2's LoRA trains no text encoder:
    trainer/families/flux2/rules.py)."""
    if encoders:
        raise ValueError("a FLUX.2 LoRA trains the transformer only")
    if transformer is None:
        raise ValueError("no LoRA layers to save")
    return kohya_tensors(transformer, dtype)


def save_lora_file(path: Any, tensors: dict[str, torch.Tensor], model: Any,
                   metadata: dict[str, Any]) -> Any:
    """Write a FLUX.2 LoRA (a run's, an extracted one) with ``metadata`` and the keys that tell
    its family: ``ss_base_model_version`` (its BFL kohya names are FLUX.1's too) and
    musubi-tuner's network module."""
    from trainer.export.hashes import add_hashes
    from trainer.export.lycoris_args import file_network_module
    from trainer.system.safe_write import save_safetensors_atomic

    meta = {k: str(v) for k, v in metadata.items()
            if k not in ("sshs_model_hash", "sshs_legacy_hash", "modelspec.hash_sha256")}
    meta.update({"ss_base_model_version": BASE_MODEL_VERSION, "ss_v2": "False",
                 "ss_network_module": file_network_module(meta, "networks.lora_flux_2"),
                 "modelspec.architecture": f"flux-2-{model.variant or 'klein-4b'}/lora",
                 "modelspec.implementation": "https://github.com/black-forest-labs/flux2"})
    meta.pop("modelspec.prediction_type", None)
    meta.setdefault("modelspec.sai_model_spec", "1.0.1")
    return save_safetensors_atomic(path, tensors, add_hashes(meta, tensors))


def save_run_lora(path: Any, tensors: dict[str, torch.Tensor], model: Any, cfg: Any,
                  metadata: dict[str, Any]) -> Any:
    """Write the run's file with sd-scripts' ``ss_*`` keys and the objective's settings."""
    f = cfg.flow
    flow = {"ss_timestep_sampling": str(f.timestep_sampling),
            "ss_discrete_flow_shift": str(float(f.discrete_flow_shift)),
            "ss_weighting_scheme": str(f.weighting_scheme)}
    return save_lora_file(path, tensors, model, {**metadata, **flow})


# --- the peers' files: network.network_weights and the tools ------------------------------------
FUSED = tuple(Fused(f"{kind}_blocks", block, fused_units(table)) for kind, block, table in BLOCKS)


def network_weights_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A FLUX.2 LoRA file's tensors as one LoRA per diffusers layer (``lora_unet_`` + its path,
    what :mod:`trainer.methods.lora_weights` loads): ours and musubi-tuner's BFL kohya names
    (a fused ``qkv`` split: block-diagonal by its rank columns, dense with the whole
    ``lora_down``), ai-toolkit's ``diffusion_model.<BFL path>`` and diffusers' example's
    ``transformer.<path>`` peft keys (scale 1)."""
    return split_units(kohya_form(tensors), FUSED)


def own_form_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A FLUX.2 LoRA file of any writer in this family's own form (BFL kohya names with alpha,
    split layers fused block-diagonally): what resize writes."""
    return fuse_parts(kohya_form(tensors), FUSED)


# --- LyCORIS (trainer/export/flow_lycoris.py) ----------------------------------------------------


def lycoris_module_name(component: str, path: str) -> str:
    """A LyCORIS file's name of a trained module: ``lycoris_`` + its diffusers path, which
    ComfyUI's Flux branch maps for FLUX.2 (its ``Flux2`` model is a ``Flux``;
    ``flux_to_diffusers``): ``attn.to_q`` / ``to_k`` / ``to_v`` and ``add_*_proj`` onto their
    rows of ``img_attn.qkv`` / ``txt_attn.qkv``, ``ff.linear_in`` / ``linear_out`` onto
    ``img_mlp.0`` / ``.2``, a single block's ``attn.to_qkv_mlp_proj`` onto ``linear1`` and
    ``attn.to_out`` onto ``linear2``, whole."""
    from trainer.export.flow_lycoris import TRANSFORMER, diffusers_lycoris_name

    if component != TRANSFORMER:
        raise ValueError(f"a FLUX.2 LyCORIS file holds the transformer only, not {component!r}")
    return diffusers_lycoris_name(path)
