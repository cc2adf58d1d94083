"""[network], continued: the options of the LyCORIS types that lycoris-lora 4.x reads beyond
the rank (the OFT constraint and rescaling, the target preset, bypass mode), mixed into
:class:`trainer.config.sections.network.NetworkSection`. Which network types read each is
``NETWORK_OPTIONS`` in :mod:`trainer.config.rules.network`."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import Section, setting

# lycoris-lora's preset names (lycoris/config.py BUILTIN_PRESET_CONFIGS) other than "ia3", which
# is network_type = 'ia3' itself; trainer/methods/lycoris_presets.py keeps their SD targets
LycorisPreset = Literal["full", "full-lin", "attn-mlp", "attn-only", "unet-only",
                        "unet-transformer-only", "unet-convblock-only"]


def _lyco(default, help: str, label: str, **bounds):
    return setting(default, help, modes=("lora",), advanced=True, label=label, **bounds)


class NetworkLycoris(Section):
    constraint: Optional[float] = _lyco(
        None, "Diag-OFT / BOFT: the largest norm of each block's rotation generator, times "
        "the layer's output size (lycoris' constraint, kohya_ss' constrain; COFT of Qiu et "
        "al. 2023); unset: unconstrained.", "OFT constraint", gt=0)
    rescaled: bool = _lyco(
        False, "Diag-OFT / BOFT: also train a per-output-channel scale of the rotated weight "
        "(lycoris' rescaled).", "OFT: rescaled")
    lycoris_preset: Optional[LycorisPreset] = _lyco(
        None, "LyCORIS types except ia3: which modules get an adapter, by lycoris' preset "
        "names: full (attention, feed-forward, ResNet and sampler convolutions, conv_in/out, "
        "time embedding, text encoders), full-lin (full without 3x3 convolutions), attn-mlp "
        "(transformer blocks and text encoders), attn-only (attention layers only), "
        "unet-only, unet-transformer-only, unet-convblock-only; unset: full (kohya_ss' "
        "LyCORIS_preset).", "LyCORIS preset")
    bypass_mode: bool = _lyco(
        False, "LyCORIS locon/loha/lokr/glora/boft/diag-oft: add the adapter's output to the "
        "frozen layer's instead of rebuilding the layer's weight each step (lycoris' "
        "bypass_mode); the same network and file, less memory for large layers.",
        "LyCORIS bypass mode")
