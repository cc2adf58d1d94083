"""Qwen-Image LoRA: which modules train, and the file in the kohya form musubi-tuner writes.

Targets: every Linear of each ``QwenImageTransformerBlock``, as musubi-tuner
(``networks/lora_qwen_image.py``: its ``_mod_`` exclusion never matches the dotted names, so the
modulations train too) and ai-toolkit (all Linear under ``transformer_blocks``) train them: the
attention's ``to_q/to_k/to_v/to_out.0`` (image) and ``add_q_proj/add_k_proj/add_v_proj/
to_add_out`` (text), the MLPs ``img_mlp.net.0.proj/net.2`` and ``txt_mlp.*``, and the
modulations ``img_mod.1`` / ``txt_mod.1`` (:data:`MODULATION`, which ``modulation=False``
leaves out). Nothing is fused: Qwen-Image's original names are diffusers' own.

The file (what ComfyUI and diffusers both load, and musubi-tuner's own output)::

    lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight   [R, in]
    lora_unet_transformer_blocks_0_attn_to_q.lora_up.weight     [out, R]
    lora_unet_transformer_blocks_0_attn_to_q.alpha              0-d: update = up @ down * alpha / R

ComfyUI maps ``lora_unet_`` + the model key with dots as underscores onto every weight of its
Qwen-Image (whose keys are these diffusers names; ``comfy/lora.py`` ``model_lora_keys_unet``) and
reads ``.alpha``; diffusers' ``QwenImagePipeline.load_lora_weights`` converts the form
(``_convert_non_diffusers_qwen_lora_to_diffusers``: alpha baked, the underscored names mapped
back). The PEFT form without alpha (diffusers' example) would load at the wrong strength in
ComfyUI whenever alpha != rank, so the kohya form with ``.alpha`` is written.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import torch

from trainer.export.lora import module_lora_tensors
from trainer.export.names import unwrap
from trainer.families.common.lora_forms import kohya_form

UNET_PREFIX = "lora_unet"
ATTENTION = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
             "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")
MLP = ("img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")
MODULATION = ("img_mod.1", "txt_mod.1")
_BLOCK = re.compile(r"^transformer_blocks\.(\d+)\.(.+)$")


def qwen_target_modules(transformer: torch.nn.Module, modulation: bool = True,
                        blocks: Optional[set[int]] = None) -> list[str]:
    """Full module paths (peft matches them exactly) of the blocks' Linear layers: attention
    and MLPs, with ``modulation`` the ``img_mod`` / ``txt_mod`` projections; ``blocks``: only
    these block indices (default all)."""
    parts = set(ATTENTION + MLP + (MODULATION if modulation else ()))
    out = []
    for name, module in unwrap(transformer).named_modules():
        match = _BLOCK.match(name)
        linear = getattr(module, "base_layer", module)
        if (match and match.group(2) in parts and isinstance(linear, torch.nn.Linear)
                and (blocks is None or int(match.group(1)) in blocks)):
            out.append(name)
    return sorted(out)


def target_modules(transformer: torch.nn.Module, train_blocks: str = "all") -> list[str]:
    """The transformer's LoRA targets (``network.train_blocks`` is FLUX.1's; Qwen-Image's
    blocks are all of one kind)."""
    return qwen_target_modules(transformer)


def transformer_tensors(transformer: torch.nn.Module, *, dtype: torch.dtype = torch.float16,
                        adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """The kohya tensors of a peft-adapted QwenImageTransformer2DModel."""
    return module_lora_tensors(transformer, UNET_PREFIX, dtype=dtype, adapter_name=adapter_name)


def run_state_dict(transformer: Optional[torch.nn.Module], encoders: dict[str, Any],
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The run's LoRA file tensors (the transformer's; a text-encoder LoRA is refused by the
    family's rules, as none of the peers trains one for Qwen-Image)."""
    if encoders:
        raise ValueError(f"a Qwen-Image LoRA file holds the transformer only; got text encoder "
                         f"LoRA on {sorted(encoders)}")
    if transformer is None:
        raise ValueError("no Qwen-Image transformer LoRA to save (network.train_unet is off)")
    return transformer_tensors(transformer, dtype=dtype)


# --- LyCORIS (trainer/export/flow_lycoris.py) ----------------------------------------------------


def lycoris_module_name(component: str, path: str) -> str:
    """A LyCORIS file's name of a trained module: ``lycoris_`` + its path, which ComfyUI's
    QwenImage branch maps onto the weight of that path (its model keys are these diffusers
    names; nothing is fused)."""
    from trainer.export.flow_lycoris import TRANSFORMER, diffusers_lycoris_name

    if component != TRANSFORMER:
        raise ValueError(f"a Qwen-Image LyCORIS file holds the transformer only, not "
                         f"{component!r}")
    return diffusers_lycoris_name(path)


# musubi-tuner's record of the model (qwen_image/qwen_image_utils.py ARCHITECTURE_QWEN_IMAGE),
# with the [flow] settings under sd-scripts' names
BASE_MODEL_VERSION = "qwen_image"
ARCHITECTURE = "qwen-image"
IMPLEMENTATION = "https://github.com/QwenLM/Qwen-Image"
HASH_KEYS = ("sshs_model_hash", "sshs_legacy_hash", "modelspec.hash_sha256")


def run_metadata(cfg: Any, base: dict[str, Any]) -> dict[str, str]:
    """The run's ``ss_*`` / ``modelspec.*`` (``base``) with Qwen-Image's version,
    architecture and the objective's settings; stale hashes dropped."""
    f = cfg.flow
    meta = {k: str(v) for k, v in base.items() if k not in HASH_KEYS}
    meta.update({
        "ss_base_model_version": BASE_MODEL_VERSION, "ss_v2": "False",
        "modelspec.architecture": f"{ARCHITECTURE}/lora",
        "modelspec.implementation": IMPLEMENTATION,
        "ss_timestep_sampling": str(f.timestep_sampling),
        "ss_discrete_flow_shift": str(float(f.discrete_flow_shift)),
        "ss_sigmoid_scale": str(float(f.sigmoid_scale)),
        "ss_model_prediction_type": str(f.model_prediction_type),
        "ss_weighting_scheme": str(f.weighting_scheme),
    })
    meta.pop("modelspec.prediction_type", None)
    meta.setdefault("modelspec.sai_model_spec", "1.0.1")
    return meta


def save_run_lora(path: Any, tensors: dict[str, torch.Tensor], model: Any, cfg: Any,
                  base: dict[str, Any]) -> Any:
    """Write the run's LoRA file: ``tensors``, :func:`run_metadata`, the ``sshs_*`` hashes."""
    from trainer.export.hashes import add_hashes
    from trainer.families.qwen_image.edit import variant_metadata
    from trainer.system.safe_write import save_safetensors_atomic

    if not tensors:
        raise ValueError(f"{path}: no LoRA tensors to save")
    meta = run_metadata(cfg, base)
    meta.update(variant_metadata(getattr(model, "variant", "base")))  # an edit model's
    return save_safetensors_atomic(path, tensors, add_hashes(meta, tensors))


def save_lora_file(path: Any, tensors: dict[str, torch.Tensor], model: Any,
                   metadata: dict[str, Any]) -> Any:
    """Write a Qwen-Image LoRA that no run made (a resized or extracted one): ``metadata`` with
    the keys that tell its family, and the hashes."""
    from trainer.export.hashes import add_hashes
    from trainer.system.safe_write import save_safetensors_atomic

    meta = {k: str(v) for k, v in metadata.items() if k not in HASH_KEYS}
    meta.update({"ss_base_model_version": BASE_MODEL_VERSION, "ss_v2": "False",
                 "modelspec.architecture": f"{ARCHITECTURE}/lora",
                 "modelspec.implementation": IMPLEMENTATION})
    meta.setdefault("modelspec.sai_model_spec", "1.0.1")
    return save_safetensors_atomic(path, tensors, add_hashes(meta, tensors))


def network_weights_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Qwen-Image LoRA file's tensors in the kohya form this studio and musubi-tuner write
    (``network.network_weights`` reads them so): the peers' peft forms (ai-toolkit's
    ``diffusion_model.<path>.lora_A/B``, diffusers' example's ``transformer.<path>``) renamed,
    with ``alpha`` = rank where the file has none (their scale 1); kohya keys as they are.
    Nothing is fused: the original names are diffusers'."""
    return kohya_form(tensors)


own_form_tensors = network_weights_tensors  # what resize writes: the same kohya form
