"""SD 3 / 3.5 LoRA: which diffusers modules train, and the file in the ``transformer.*`` form.

sd-scripts' own SD3 format (``lora_unet_joint_blocks_0_x_block_attn_qkv``) loads in diffusers'
``StableDiffusion3Pipeline.load_lora_weights`` without any effect (it converts nothing and keeps
only ``transformer.`` / ``text_encoder.`` / ``text_encoder_2.`` keys; sd-scripts issues 1743 and
2103), so our SD 3.5 files are in the form both diffusers and ComfyUI load::

    transformer.transformer_blocks.0.attn.to_q.lora_A.weight   [r, in]
    transformer.transformer_blocks.0.attn.to_q.lora_B.weight   [out, r]
    text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight   (CLIP-L)
    text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight (CLIP-G)

Alpha: this form has no alpha in diffusers (it loads ``lora_alpha = r`` per module, scale 1:
``get_peft_kwargs`` in diffusers 0.42), and ComfyUI's ``load_lora`` takes alpha only from a
``<module>.alpha`` tensor, scale 1 without one. So the file holds no alpha and each module's
``alpha / r`` (peft's ``scaling``, rsLoRA included) is folded into its ``lora_B``: the update
``lora_B @ lora_A`` is then the trained one in both. ComfyUI maps these keys through
``mmdit_to_diffusers`` (comfy/utils.py) onto SAI's fused ``qkv`` slices, and swaps the last
block's pre-only context modulation itself, so the ``transformer.*`` form needs no care there.

Targets (sd-scripts' ``networks/lora_sd3.py``: every Linear inside ``x_block`` and
``context_block`` of each joint block): :data:`SD3_PARTS`, SAI name -> diffusers module. The last
block's context side is pre-only (``attn.qkv`` and ``adaLN_modulation.1`` only) and ``attn2``
exists only in 3.5 medium's dual-attention blocks; :func:`sd3_target_modules` lists the modules
that exist. ComfyUI's ``mmdit_to_diffusers`` in the snapshot read for this (comfy/utils.py at
2ba5cc8b) maps no ``attn2`` key, so ``attn2=False`` gives a file every ComfyUI applies fully.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Optional

import torch

from trainer.export.lora import _check_exportable, iter_lora_layers
from trainer.export.names import text_encoder_module_path, unwrap

# sd-scripts' kohya part name (joint_blocks_N_<part>) -> diffusers modules of transformer_blocks.N
SD3_PARTS: dict[str, tuple[str, ...]] = {
    "x_block_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "x_block_attn_proj": ("attn.to_out.0",),
    "x_block_attn2_qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
    "x_block_attn2_proj": ("attn2.to_out.0",),
    "x_block_mlp_fc1": ("ff.net.0.proj",),
    "x_block_mlp_fc2": ("ff.net.2",),
    "x_block_adaLN_modulation_1": ("norm1.linear",),
    "context_block_attn_qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "context_block_attn_proj": ("attn.to_add_out",),
    "context_block_mlp_fc1": ("ff_context.net.0.proj",),
    "context_block_mlp_fc2": ("ff_context.net.2",),
    "context_block_adaLN_modulation_1": ("norm1_context.linear",),
}
ATTN2_PARTS = ("x_block_attn2_qkv", "x_block_attn2_proj")


def sd3_target_modules(transformer: torch.nn.Module, parts: Optional[Iterable[str]] = None,
                       attn2: bool = True) -> list[str]:
    """Full diffusers module paths of the joint blocks' LoRA targets (peft matches them
    exactly); ``parts`` picks sd-scripts' part names (default all), ``attn2`` 3.5 medium's."""
    chosen = set(parts) if parts is not None else set(SD3_PARTS)
    if chosen - set(SD3_PARTS):
        raise ValueError(f"unknown SD3 LoRA parts {sorted(chosen - set(SD3_PARTS))}; "
                         f"the parts are {sorted(SD3_PARTS)}")
    if not attn2:
        chosen -= set(ATTN2_PARTS)
    suffixes = {m for part in chosen for m in SD3_PARTS[part]}
    pattern = re.compile(r"^transformer_blocks\.\d+\.(.+)$")
    out = []
    for name, module in unwrap(transformer).named_modules():
        match = pattern.match(name)
        linear = getattr(module, "base_layer", module)  # a peft layer wraps the Linear
        if match and match.group(1) in suffixes and isinstance(linear, torch.nn.Linear):
            out.append(name)
    return sorted(out)


def peft_module_tensors(model: torch.nn.Module, prefix: str, *,
                        dtype: torch.dtype = torch.float16, adapter_name: str = "default",
                        rename=None) -> dict[str, torch.Tensor]:
    """``<prefix>.<module path>.lora_A.weight`` / ``.lora_B.weight`` with ``alpha / r`` folded
    into ``lora_B`` (see the module's docstring)."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in iter_lora_layers(model, adapter_name):
        _check_exportable(name, layer, adapter_name)
        key = f"{prefix}.{rename(name) if rename else name}"
        scale = float(layer.scaling[adapter_name])
        down = layer.lora_A[adapter_name].weight.detach().float()
        up = layer.lora_B[adapter_name].weight.detach().float() * scale
        out[key + ".lora_A.weight"] = down.to(device="cpu", dtype=dtype).contiguous()
        out[key + ".lora_B.weight"] = up.to(device="cpu", dtype=dtype).contiguous()
    return out


def sd3_state_dict(transformer: Optional[torch.nn.Module],
                   text_encoder: Optional[torch.nn.Module] = None,
                   text_encoder_2: Optional[torch.nn.Module] = None, *,
                   dtype: torch.dtype = torch.float16,
                   adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """An SD 3.5 LoRA in the ``transformer.*`` form: the transformer, CLIP-L
    (``text_encoder.``) and CLIP-G (``text_encoder_2.``), alpha folded into ``lora_B``.

    T5 is not written: diffusers' SD3 loader reads no T5 LoRA, so such a file would load
    differently in diffusers and ComfyUI; train T5 LoRA on FLUX.1 files only, or not at all.
    """
    tensors: dict[str, torch.Tensor] = {}
    if transformer is not None:
        tensors.update(peft_module_tensors(transformer, "transformer", dtype=dtype,
                                           adapter_name=adapter_name))
    for prefix, encoder in (("text_encoder", text_encoder), ("text_encoder_2", text_encoder_2)):
        if encoder is not None:
            tensors.update(peft_module_tensors(encoder, prefix, dtype=dtype,
                                               adapter_name=adapter_name,
                                               rename=text_encoder_module_path))
    if not tensors:
        raise ValueError(f"no LoRA layers with adapter {adapter_name!r} to save")
    return tensors


# --- the run's LoRA (trainer/methods/lora.py, flow_lora.py): the questions every transformer
# family's lora role answers


def target_modules(transformer: torch.nn.Module, train_blocks: str = "all") -> list[str]:
    """The transformer's LoRA targets (every joint block's; ``train_blocks`` is FLUX.1's)."""
    return sd3_target_modules(transformer)


def run_state_dict(transformer: Optional[torch.nn.Module], encoders: dict,
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The run's LoRA file tensors; ``encoders``: the trained text encoders by attribute."""
    return sd3_state_dict(transformer, encoders.get("text_encoder"),
                          encoders.get("text_encoder_2"), dtype=dtype)


def lycoris_module_name(component: str, path: str) -> str:
    """A LyCORIS file's name of a trained module (trainer/export/flow_lycoris.py): the
    transformer's by its diffusers path (``lycoris_transformer_blocks_0_attn_to_q``, which
    ComfyUI maps through ``mmdit_to_diffusers`` onto SAI's fused ``attn.qkv`` rows), the text
    encoders as sd-scripts and ComfyUI number them (CLIP-L ``lora_te1_``, CLIP-G ``lora_te2_``,
    T5 ``lora_te3_``)."""
    from trainer.export.flow_lycoris import TRANSFORMER, diffusers_lycoris_name
    from trainer.export.names import kohya_module_name

    prefixes = {"text_encoder": "lora_te1", "text_encoder_2": "lora_te2",
                "text_encoder_3": "lora_te3"}
    if component == TRANSFORMER:
        return diffusers_lycoris_name(path)
    if component not in prefixes:
        raise ValueError(f"SD 3.5 has no component {component!r} for a LyCORIS file")
    clip = component != "text_encoder_3"
    return kohya_module_name(prefixes[component], text_encoder_module_path(path) if clip else path)
