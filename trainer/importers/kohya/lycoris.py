"""kohya_ss' ``LyCORIS_preset`` as ``network.lycoris_preset``.

kohya_ss passes ``preset=<LyCORIS_preset>`` to lycoris.kohya for every LyCORIS type; its
dropdown offers lycoris' preset names and takes a typed value too, which lycoris then reads as a
preset file. A name this studio has is taken, "full" (lycoris' default) leaves the default, and
anything else (a file) is reported as not supported.
"""

from __future__ import annotations

from typing import Any, get_args

from trainer.config.sections.network_lycoris import LycorisPreset
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.table import Refused

PRESET_NAMES = get_args(LycorisPreset)


def lycoris_preset(value: Any) -> Any:
    """kohya_ss' LyCORIS_preset -> network.lycoris_preset."""
    text = c.to_text(value)
    if text is c.UNSET or text == "full":
        return c.UNSET
    if text in PRESET_NAMES:
        return text
    return Refused(f"a LyCORIS preset this studio does not have (a preset file?); the presets "
                   f"here are {', '.join(PRESET_NAMES)}")


def _preset(ctx: Any) -> Any:
    value = lycoris_preset(ctx.raw("LyCORIS_preset")) if "LyCORIS_preset" in ctx.data else c.UNSET
    return value if isinstance(value, str) else None


def unused_conv_keys(ctx: Any) -> dict[str, str]:
    """conv_dim / conv_alpha, which kohya_ss saves for every type, when the preset adapts no
    3x3 convolution (lycoris then ignores them): kohya key -> reason."""
    from trainer.config.rules.lycoris import PRESETS_WITHOUT_CONV
    from trainer.families import spec
    from trainer.importers.kohya.flow import family_of

    try:
        family = family_of(ctx.data)
    except ValueError:  # both switches on: flow() reports it
        family = None
    preset = _preset(ctx)
    if family is not None and spec(family).denoiser == "transformer":
        reason = f"{spec(family).label}'s transformer has no 3x3 convolution; lycoris adapts none"
    elif preset in PRESETS_WITHOUT_CONV:
        reason = f"LyCORIS_preset {preset!r} adapts no 3x3 convolution; lycoris ignores it"
    else:
        return {}
    return {key: reason for key in ("conv_dim", "conv_alpha")}


def text_encoder_off(ctx: Any) -> None:
    """A preset without text-encoder modules trains nothing there in sd-scripts, whatever the
    text-encoder rate: the text encoder is then not trained here either, with a note."""
    from trainer.config.rules.lycoris import PRESETS_WITHOUT_TEXT_ENCODER

    preset, net = _preset(ctx), ctx.out.get("network", {})
    if preset not in PRESETS_WITHOUT_TEXT_ENCODER:
        return
    for name in ("train_text_encoder", "train_text_encoder_2"):
        if net.get(name):
            ctx.set("LyCORIS_preset", f"network.{name}", False)
            ctx.note("LyCORIS_preset", f"{preset!r} adapts no text-encoder module, so "
                                       f"network.{name} is off (sd-scripts trains none there)")
