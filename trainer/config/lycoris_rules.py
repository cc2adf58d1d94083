"""``network.lycoris_preset`` with settings that its targets cannot serve, refused at load.

lycoris-lora's presets (lycoris/config.py; trainer/methods/lycoris_presets.py keeps their SD
targets) differ in two ways that other settings depend on: some adapt no text-encoder module, so
``train_text_encoder`` would train nothing there, and some turn the 3x3 convolutions off
(``enable_conv = False``), so a ``conv_dim`` would be ignored. tests/test_lycoris_preset.py checks
these lists against the package's presets.
"""

from __future__ import annotations

from typing import Any

PRESETS_WITHOUT_TEXT_ENCODER = ("unet-only", "unet-transformer-only", "unet-convblock-only")
PRESETS_WITHOUT_CONV = ("full-lin", "attn-mlp", "attn-only", "unet-transformer-only")


def lycoris_preset_checks(net: Any) -> None:
    """Refuse a text encoder or a conv rank that ``net.lycoris_preset`` would not train."""
    preset = net.lycoris_preset
    if preset in PRESETS_WITHOUT_TEXT_ENCODER and (net.train_text_encoder
                                                    or net.train_text_encoder_2):
        raise ValueError(f"network.lycoris_preset = {preset!r} adapts no text-encoder module, "
                         f"but network.train_text_encoder is on: turn it off or choose a preset "
                         f"with the text encoders (full, full-lin, attn-mlp, attn-only)")
    if preset in PRESETS_WITHOUT_CONV and net.conv_dim is not None:
        raise ValueError(f"network.lycoris_preset = {preset!r} adapts no 3x3 convolution, so "
                         f"network.conv_dim would be ignored: unset conv_dim (and conv_alpha) or "
                         f"choose full, unet-only or unet-convblock-only")
