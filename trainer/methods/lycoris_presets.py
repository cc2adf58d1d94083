"""lycoris-lora's target presets (``network.lycoris_preset``, kohya_ss' ``LyCORIS_preset``) for
the diffusers SD UNet and the CLIP text encoders.

lycoris' presets (lycoris/config.py, ``PRESET``) name the blocks to adapt by class, for many
architectures at once. Against a diffusers SD model two of their spellings go wrong: "attn-only"
names the attention class of the original LDM code (``CrossAttention``; diffusers calls it
``Attention``), which matches nothing here, and the "full" family lists ``TimestepEmbedding``
(another architecture's block) which, in a diffusers UNet, is the time embedding that the
preset also names by path (lycoris 4.1 stops on the duplicated name). :func:`sd_preset` keeps
each preset's meaning on SD: its classes that SD models have (the LDM attention names read as
diffusers'), its names, its conv switch and its text-encoder classes.
"""

from __future__ import annotations

from typing import Any

# the block classes of a diffusers SD 1.x / 2.x / SDXL UNet that lycoris' presets name
SD_UNET_CLASSES = ("Transformer2DModel", "ResnetBlock2D", "Downsample2D", "Upsample2D",
                   "Attention")
SD_TEXT_ENCODER_CLASSES = ("CLIPAttention", "CLIPSdpaAttention", "CLIPMLP")
# the original (LDM / sd-scripts) attention classes -> diffusers' class
LDM_ATTENTION = {"CrossAttention": "Attention", "SelfAttention": "Attention"}


def _keep(classes: list[str], known: tuple[str, ...]) -> list[str]:
    out = [LDM_ATTENTION.get(name, name) for name in classes]
    return list(dict.fromkeys(name for name in out if name in known))


def sd_preset(name: str) -> dict[str, Any]:
    """lycoris' preset ``name`` with the targets a diffusers SD model has."""
    from lycoris.config import PRESET

    preset = PRESET[name]
    return {
        "enable_conv": preset["enable_conv"],
        "unet_target_module": _keep(preset["unet_target_module"], SD_UNET_CLASSES),
        "unet_target_name": list(preset["unet_target_name"]),
        "text_encoder_target_module": _keep(preset["text_encoder_target_module"],
                                            SD_TEXT_ENCODER_CLASSES),
        "text_encoder_target_name": list(preset["text_encoder_target_name"]),
        "module_algo_map": {}, "name_algo_map": {}, "use_fnmatch": False, "exclude_name": [],
    }


def trains_text_encoder(name: str) -> bool:
    """Whether preset ``name`` adapts anything in a text encoder."""
    preset = sd_preset(name)
    return bool(preset["text_encoder_target_module"] or preset["text_encoder_target_name"])


def transformer_preset(targets: list[str]) -> dict[str, Any]:
    """A transformer family's targets: exactly the diffusers module paths of its LoRA
    (``target_modules`` of its lora role), anchored (lycoris matches a name with ``re.match``,
    so ``transformer_blocks.1.attn.to_q`` would also match block 10's ``...to_q`` prefix
    otherwise), and the text encoders' Linears that its LoRA trains there (CLIP's attention and
    MLP; T5's attention and gated feed-forward)."""
    import re

    from trainer.methods.lora import T5_TARGETS, TEXT_ENCODER_TARGETS

    encoder = "|".join(re.escape(t) for t in (*TEXT_ENCODER_TARGETS, *T5_TARGETS))
    return {
        "enable_conv": False,
        "unet_target_module": [], "unet_target_name": [re.escape(t) + "$" for t in targets],
        "text_encoder_target_module": [], "text_encoder_target_name": [rf".*\.({encoder})$"],
        "module_algo_map": {}, "name_algo_map": {}, "use_fnmatch": False, "exclude_name": [],
    }
