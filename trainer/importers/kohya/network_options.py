"""kohya_ss keys of sd-scripts' LoRA network options beyond the rank: LoRA+,
block-wise learning rates and ranks, continuing from a file, max-norm. Each is one schema key of
[network] (trainer/config/sections/lora.py); table.DIRECT takes them in.

kohya_ss passes the block lists as sd-scripts' ``network_args`` text (``"4,4,8,..."``), the
lr weights as text too (a list or a named shape such as ``sine+0.5``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.importers.kohya import convert as c


def number_list(kind: Callable[[str], Any]) -> Callable[[Any], Any]:
    """``"4,4,8"`` (or a JSON list) -> [4, 4, 8]; empty -> unset."""
    def convert(value: Any) -> Any:
        if c.is_empty(value):
            return c.UNSET
        items = value if isinstance(value, list) else str(value).split(",")
        try:
            return [kind(float(str(v).strip())) if kind is int else kind(str(v).strip())
                    for v in items]
        except ValueError:
            raise ValueError("comma-separated numbers, one per UNet block") from None
    return convert


def weights_text(value: Any) -> Any:
    text = c.to_text(value)
    return text if text is c.UNSET else text.replace(" ", "")


_pos = c.nonzero(c.to_float)
# kohya key -> (our dotted key, converter); LoRA mode only
NETWORK_DIRECT: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "loraplus_lr_ratio": ("network.loraplus_lr_ratio", _pos),
    "loraplus_unet_lr_ratio": ("network.loraplus_unet_lr_ratio", _pos),
    "loraplus_text_encoder_lr_ratio": ("network.loraplus_text_encoder_lr_ratio", _pos),
    "down_lr_weight": ("network.down_lr_weight", weights_text),
    "mid_lr_weight": ("network.mid_lr_weight", weights_text),
    "up_lr_weight": ("network.up_lr_weight", weights_text),
    "block_lr_zero_threshold": ("network.block_lr_zero_threshold", _pos),
    "block_dims": ("network.block_dims", number_list(int)),
    "block_alphas": ("network.block_alphas", number_list(float)),
    "conv_block_dims": ("network.conv_block_dims", number_list(int)),
    "conv_block_alphas": ("network.conv_block_alphas", number_list(float)),
    "network_weights": ("network.network_weights", c.to_text),
    "lora_network_weights": ("network.network_weights", c.to_text),
    "scale_weight_norms": ("network.scale_weight_norms", _pos),
}
