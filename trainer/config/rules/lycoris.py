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


def problems(cfg: Any) -> list[str]:
    """A text encoder or a conv rank that ``network.lycoris_preset`` would not train."""
    net = cfg.network
    preset = net.lycoris_preset
    if preset in PRESETS_WITHOUT_TEXT_ENCODER and (net.train_text_encoder
                                                    or net.train_text_encoder_2):
        return [f"network.lycoris_preset = {preset!r} adapts no text-encoder module, but "
                f"network.train_text_encoder is on: turn it off or choose a preset with the "
                f"text encoders (full, full-lin, attn-mlp, attn-only)"]
    if preset in PRESETS_WITHOUT_CONV and net.conv_dim is not None:
        return [f"network.lycoris_preset = {preset!r} adapts no 3x3 convolution, so "
                f"network.conv_dim would be ignored: unset conv_dim (and conv_alpha) or choose "
                f"full, unet-only or unet-convblock-only"]
    return []
