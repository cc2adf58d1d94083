"""A transformer family's LyCORIS file (LoCon, LoHa, LoKr, DoRA): each lycoris module's own
tensors under the name the family's ``lora`` role gives the module it adapts.

The adapters train on diffusers' transformer, whose layers are not always the original's: FLUX.1
and SD 3.5 fuse q, k and v (FLUX.1's single blocks also the MLP's input) into one Linear that
diffusers splits. A LoRA's update of the parts stacks into one update of the fused layer
(trainer/families/flux/lora.py), but a Kronecker or Hadamard product does not: ``kron(A, B)``
of to_q, to_k and to_v is no ``kron`` of the fused qkv. So the file names each diffusers module
as lycoris-lora itself names the modules of a diffusers model (``LycorisNetwork.LORA_PREFIX``,
``lycoris_`` + the module path, '.' -> '_'; SimpleTuner writes the same), one adapter per
diffusers layer::

    lycoris_transformer_blocks_0_attn_to_q.lokr_w1 / .lokr_w2 (or _a/_b) / .alpha
    lycoris_single_transformer_blocks_0_proj_mlp.hada_w1_a ...
    lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lokr_w1   (a text encoder's, as
                                                                     its LoRA names it)

ComfyUI (comfy/lora.py ``model_lora_keys_unet``) maps ``lycoris_<diffusers path>`` for FLUX.1,
FLUX.2 and Chroma (its ``Flux2`` and ``Chroma`` are ``Flux`` models: ``flux_to_diffusers``), SD 3
(``mmdit_to_diffusers``), Qwen-Image, Z-Image / Lumina 2 and HiDream onto the original weight,
a split layer onto its rows of the fused weight (an offset): ``calculate_weight`` narrows the
weight to those rows and its LoRA, LoHa and LoKr adapters add their update there in place
(DoRA's ``weight_decompose`` too). Its bypass mode (for quantized weights) does not honour
offsets, for any adapter, plain LoRA's diffusers-named files included.

diffusers 0.42 applies one kind of these files: ``Flux2KleinPipeline.load_lora_weights`` reads
a FLUX.2 LoKr (``_convert_lycoris_flux2_lokr_to_diffusers``), not its LoCon or LoHa; FLUX.1's,
Chroma's, Qwen-Image's and Z-Image's pipelines load nothing of them or refuse them
(tests/test_lycoris_flow.py, tests/test_lycoris_flow_families.py).

A family answers, in its ``lora`` role: ``target_modules(transformer, train_blocks)`` (what
trains, the same modules as its LoRA) and ``lycoris_module_name(component, path)`` (a module's
name in the file; ``component`` is ``"transformer"`` or a text encoder's attribute).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from trainer.export.names import kohya_module_name, unwrap

LYCORIS_PREFIX = "lycoris"  # lycoris-lora's LycorisNetwork.LORA_PREFIX
TRANSFORMER = "transformer"  # the component name of the denoiser in lycoris_module_name


def diffusers_lycoris_name(path: str) -> str:
    """``transformer_blocks.0.attn.to_q`` -> ``lycoris_transformer_blocks_0_attn_to_q``."""
    return kohya_module_name(LYCORIS_PREFIX, path)


def lycoris_names(version: str, loras: Iterable[Any],
                  roots: Iterable[tuple[str, Any]]) -> dict[int, str]:
    """id(lora) -> the file's name of the module it adapts, for the modules under ``roots``
    (component, module); a lora elsewhere is left out."""
    from trainer.families import role

    namer = role(version, "lora").lycoris_module_name
    places: dict[int, tuple[str, str]] = {}
    for component, root in roots:
        if root is not None:
            for path, module in unwrap(root).named_modules():
                places.setdefault(id(module), (component, path))
    return {id(lora): namer(*places[id(lora.org_module[0])]) for lora in loras
            if id(lora.org_module[0]) in places}


def flow_lycoris_tensors(version: str, loras: Iterable[Any], roots: Iterable[tuple[str, Any]],
                         dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """Each lycoris module's ``state_dict`` under its module's name, cast to ``dtype``."""
    loras, roots = list(loras), list(roots)
    names = lycoris_names(version, loras, roots)
    out: dict[str, torch.Tensor] = {}
    for lora in loras:
        name = names.get(id(lora))
        if name is None:
            raise ValueError(f"{lora.lora_name}: its module is in none of the saved models")
        for key, tensor in lora.state_dict().items():
            if f"{name}.{key}" in out:
                raise ValueError(f"two modules map to the same name {name!r}")
            out[f"{name}.{key}"] = tensor.detach().to("cpu", dtype).clone().contiguous()
    if not out:
        raise ValueError("no LyCORIS modules to save")
    return out
