"""Z-Image LoRA: which diffusers modules train, and the file in the form ComfyUI and diffusers
both load.

**What trains** (musubi-tuner's ``networks/lora_zimage.py``): the Linear layers of the 30 main
``layers.N``: the attention's ``to_q``/``to_k``/``to_v``/``to_out.0`` and the SwiGLU's
``feed_forward.w1``/``w2``/``w3``; not the adaLN modulations nor the embedders. With
``network.train_blocks = "with_refiners"`` the two ``noise_refiner`` and two ``context_refiner``
blocks' too, as diffusers' example trains them (ComfyUI's native names for them are the same
form: ``lora_unet_noise_refiner_0_attention_qkv``...).

**The file** names the modules by the original (ComfyUI native) layout in kohya form::

    lora_unet_layers_0_attention_qkv.lora_down.weight    [3R, dim]
    lora_unet_layers_0_attention_qkv.lora_up.weight      [3 dim, 3R]  block-diagonal
    lora_unet_layers_0_attention_qkv.alpha               update = up @ down * alpha / 3R
    lora_unet_layers_0_attention_out.*                   (diffusers' to_out.0)
    lora_unet_layers_0_feed_forward_w1.*                 (w2, w3 alike)

Why this form: ComfyUI maps ``lora_unet_`` + every native weight's path with dots as
underscores (``comfy/lora.py`` ``model_lora_keys_unet``), and the native layout fuses q, k, v
into ``attention.qkv`` and names the output ``attention.out``; musubi-tuner's raw names on
diffusers' modules (``..._attention_to_q``, ``..._to_out_0``) are the ones ComfyUI logs as "lora
key not loaded" (musubi-tuner issue 770). diffusers' ``ZImagePipeline.load_lora_weights``
(``_convert_non_diffusers_z_image_lora_to_diffusers``) reads these names too: it splits the
fused ``qkv`` rows back into ``to_q``/``to_k``/``to_v`` (each with the whole ``lora_down``, which
the block-diagonal ``up`` makes exact) and bakes ``alpha / rank`` in.
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
# native part (kohya name after the block) -> the diffusers modules of the block it covers,
# in the fused weight's row order (ComfyUI's z_image_to_diffusers)
PARTS: dict[str, tuple[str, ...]] = {
    "attention_qkv": ("attention.to_q", "attention.to_k", "attention.to_v"),
    "attention_out": ("attention.to_out.0",),
    "feed_forward_w1": ("feed_forward.w1",),
    "feed_forward_w2": ("feed_forward.w2",),
    "feed_forward_w3": ("feed_forward.w3",),
}
BLOCKS = ("layers", "noise_refiner", "context_refiner")
# network.train_blocks -> the blocks that train: the main layers (musubi-tuner's and
# ai-toolkit's choice, the default), or with the refiners (diffusers' example's)
TRAIN_BLOCKS = {"all": ("layers",), "with_refiners": BLOCKS}
BASE_MODEL_VERSION = "zimage"  # ss_base_model_version (the spec's kohya_version)


def block_count(transformer: torch.nn.Module, block: str) -> int:
    pattern = re.compile(rf"^{block}\.(\d+)$")
    found = [int(m.group(1)) for n, _ in unwrap(transformer).named_modules()
             if (m := pattern.match(n))]
    return max(found) + 1 if found else 0


def part_modules(transformer: torch.nn.Module, blocks: tuple[str, ...] = BLOCKS
                 ) -> dict[str, tuple[str, ...]]:
    """Native module path (``layers.0.attention.qkv``) -> the diffusers paths it covers."""
    out = {}
    for block in blocks:
        for n in range(block_count(transformer, block)):
            for part, modules in PARTS.items():
                native = f"{block}.{n}.{part.replace('_', '.', 1)}"
                out[native.replace("feed.forward", "feed_forward")] = tuple(
                    f"{block}.{n}.{m}" for m in modules)
    return out


def target_modules(transformer: torch.nn.Module, train_blocks: str = "all") -> list[str]:
    """The diffusers module paths peft wraps (full paths: matched exactly) of the blocks
    ``network.train_blocks`` picks (:data:`TRAIN_BLOCKS`)."""
    if train_blocks not in TRAIN_BLOCKS:
        raise ValueError(f"network.train_blocks = {train_blocks!r}: Z-Image's are "
                         f"{', '.join(map(repr, TRAIN_BLOCKS))}")
    return sorted(m for group in part_modules(transformer, TRAIN_BLOCKS[train_blocks]).values()
                  for m in group)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=dtype).contiguous()


def kohya_tensors(transformer: torch.nn.Module, dtype: torch.dtype = torch.bfloat16,
                  adapter: str = "default") -> dict[str, torch.Tensor]:
    """The file's tensors of a peft-adapted ``ZImageTransformer2DModel`` (native names)."""
    layers = dict(iter_lora_layers(transformer, adapter))
    for name, layer in layers.items():
        _check_exportable(name, layer, adapter)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for native, modules in part_modules(transformer).items():
        present = [m for m in modules if m in layers]
        if not present:
            continue
        if len(present) != len(modules):
            raise ValueError(f"LoRA on {present} but not on all of {list(modules)}: the fused "
                             f"{native} of the file needs all of them")
        rows = [unwrap(transformer).get_submodule(m).out_features for m in modules]
        down, up, alpha = fuse([layers[m] for m in modules], rows, adapter)
        key = kohya_module_name(UNET_PREFIX, native)
        out[key + ".lora_down.weight"] = _cast(down, dtype)
        out[key + ".lora_up.weight"] = _cast(up, dtype)
        out[key + ".alpha"] = torch.tensor(alpha, dtype=dtype)
        used.update(modules)
    left = sorted(set(layers) - used)
    if left:
        raise ValueError(f"LoRA on {left[:5]} has no name in Z-Image's native layout; train "
                         f"only the modules of target_modules()")
    return out


def run_state_dict(transformer: Optional[torch.nn.Module], encoders: dict[str, Any],
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The run's LoRA file tensors (the transformer's; Z-Image's LoRA trains no text
    encoder: trainer/families/zimage/rules.py)."""
    if encoders:
        raise ValueError("a Z-Image LoRA trains the transformer only")
    if transformer is None:
        raise ValueError("no LoRA layers to save")
    return kohya_tensors(transformer, dtype)


def save_lora_file(path: Any, tensors: dict[str, torch.Tensor], model: Any,
                   metadata: dict[str, Any]) -> Any:
    """Write a Z-Image LoRA (a run's, a resized or extracted one) with ``metadata`` and the
    keys that tell its family (musubi-tuner's version and network module)."""
    from trainer.export.hashes import add_hashes
    from trainer.export.lycoris_args import file_network_module
    from trainer.system.safe_write import save_safetensors_atomic

    meta = {k: str(v) for k, v in metadata.items()
            if k not in ("sshs_model_hash", "sshs_legacy_hash", "modelspec.hash_sha256")}
    meta.update({"ss_base_model_version": BASE_MODEL_VERSION, "ss_v2": "False",
                 "ss_network_module": file_network_module(meta, "networks.lora_zimage"),
                 "modelspec.architecture": f"z-image-{model.variant or 'turbo'}/lora",
                 "modelspec.implementation": "https://github.com/Tongyi-MAI/Z-Image"})
    meta.pop("modelspec.prediction_type", None)
    meta.setdefault("modelspec.sai_model_spec", "1.0.1")
    return save_safetensors_atomic(path, tensors, add_hashes(meta, tensors))


def save_run_lora(path: Any, tensors: dict[str, torch.Tensor], model: Any, cfg: Any,
                  metadata: dict[str, Any]) -> Any:
    """Write the run's file with sd-scripts' ``ss_*`` keys and the objective's settings."""
    f = cfg.flow
    return save_lora_file(path, tensors, model, {
        **metadata, "ss_timestep_sampling": str(f.timestep_sampling),
        "ss_discrete_flow_shift": str(float(f.discrete_flow_shift)),
        "ss_weighting_scheme": str(f.weighting_scheme)})


# --- LyCORIS (trainer/export/flow_lycoris.py) ----------------------------------------------------


def lycoris_module_name(component: str, path: str) -> str:
    """A LyCORIS file's name of a trained module: ``lycoris_`` + its diffusers path, which
    ComfyUI's Lumina 2 branch maps for Z-Image (``z_image_to_diffusers``): ``attention.to_q`` /
    ``to_k`` / ``to_v`` onto their rows of the native ``attention.qkv``, ``to_out.0`` onto
    ``attention.out``, ``feed_forward.w1`` / ``w2`` / ``w3`` and ``adaLN_modulation.0`` as they
    are, in the main layers and both refiners."""
    from trainer.export.flow_lycoris import TRANSFORMER, diffusers_lycoris_name

    if component != TRANSFORMER:
        raise ValueError(f"a Z-Image LyCORIS file holds the transformer only, not {component!r}")
    return diffusers_lycoris_name(path)


# --- the peers' files: network.network_weights and the tools ------------------------------------

# the native layer (kohya part) -> the diffusers layers it is, for lora_forms (feed_forward and
# adaLN_modulation have the same names in both layouts)
FUSED = tuple(Fused(b, b, fused_units({"attention_qkv": PARTS["attention_qkv"],
                                       "attention_out": PARTS["attention_out"]}))
              for b in BLOCKS)


def network_weights_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Z-Image LoRA file's tensors under the names :mod:`trainer.methods.lora_weights` loads
    (``lora_unet_`` + each diffusers layer's path): ours and ComfyUI's native ones (fused
    ``qkv`` split, ``attention_out`` -> ``attention_to_out_0``), musubi-tuner's as they are,
    ai-toolkit's and diffusers' peft form (``diffusion_model.`` / ``transformer.`` +
    ``lora_A``/``lora_B``, scale 1: alpha = rank)."""
    return split_units(kohya_form(tensors), FUSED)


def own_form_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Z-Image LoRA file of any writer in this family's own form (the native names ComfyUI
    loads, q/k/v fused block-diagonally): what resize writes."""
    return fuse_parts(kohya_form(tensors), FUSED)
