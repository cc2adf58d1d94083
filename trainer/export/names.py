"""Module names as the files name them: kohya's ``lora_unet_...`` from a module path, the CLIP
text encoder's path under ``text_model.``, and the model under its DDP / compile wrappers.

Shared by the LoRA and LyCORIS writers (:mod:`trainer.export.lora`,
:mod:`trainer.export.lycoris`) and the single-file checkpoint writer
(:mod:`trainer.families.sd.checkpoint`); imports nothing of the trainer, so none of them has to
import another for a name. Which prefix each text encoder takes is the family's
(``TE_PREFIXES`` of its lora role, :func:`trainer.export.metadata.lora_naming`).
"""

from __future__ import annotations

import torch

UNET_PREFIX = "lora_unet"
TEXT_ENCODER_PREFIX = "lora_te"  # SD 1.x/2.x; SDXL uses lora_te1 / lora_te2


def kohya_module_name(prefix: str, module_path: str) -> str:
    """``lora_unet`` + ``down_blocks.0.attentions.0.proj_in`` -> ``lora_unet_down_blocks_0_...``."""
    return f"{prefix}_{module_path.replace('.', '_')}"


def text_encoder_module_path(module_path: str) -> str:
    """The CLIP text encoder's path as the checkpoint names it: always under ``text_model.``.

    transformers 5 flattened ``CLIPTextModel`` (``encoder.layers.0...``); transformers 4 and the
    original checkpoints have ``text_model.encoder.layers.0...``. Both give the same kohya name.
    """
    if module_path.startswith("text_model."):
        return module_path
    return "text_model." + module_path


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model under DistributedDataParallel / torch.compile wrappers, whose module paths
    would otherwise start with ``module.`` / ``_orig_mod.``."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            inner = model.module
        if inner is None:
            return model
        model = inner
