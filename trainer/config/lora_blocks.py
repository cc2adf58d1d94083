"""Block-wise LoRA as sd-scripts' ``networks/lora.py`` counts the UNet's blocks: per-block
learning-rate weights (``down_lr_weight`` / ``mid_lr_weight`` / ``up_lr_weight`` with the named
shapes and ``+N`` offsets, ``block_lr_zero_threshold``) and per-block ranks and alphas
(``block_dims`` / ``block_alphas``, ``conv_block_dims`` / ``conv_block_alphas``).

The blocks (sd-scripts' ``get_block_index``) are a family's own: its ``rules`` role
(trainer/families/<folder>/rules.py) holds ``LORA_BLOCKS`` (the down/up and mid lr weights and
the blocks: SD 1.x / 2.x 12, 1, 25; SDXL 9, 3, 23) and ``lora_block_index`` (a module's block
from its kohya name); a family without them has no block-wise LoRA. Blocks beyond the lr
weights (SDXL's first and last) take weight 1.0. A weight at or under the threshold is 0,
and a block whose weight is 0 gets no LoRA at all (its dims become 0), as in sd-scripts. Pure
functions, no torch: the config checks them at load and the LoRA method builds the network
from them.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from trainer.families import FAMILIES, role

SHAPES = ("cosine", "sine", "linear", "reverse_linear", "zeros")


def lora_blocks(family: Optional[str]) -> Optional[tuple[int, int, int]]:
    """(down/up lr weights, mid lr weights, blocks) of ``family``'s UNet; None: no blocks."""
    rules = role(family, "rules") if family in FAMILIES else None
    return getattr(rules, "LORA_BLOCKS", None)


# family -> (down/up weights, mid weights, total blocks), for the families that have blocks
BLOCK_COUNTS = {name: lora_blocks(name) for name in FAMILIES if lora_blocks(name)}
LR_KEYS = ("down_lr_weight", "mid_lr_weight", "up_lr_weight")
DIM_KEYS = ("block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas")


def shape(text: str, n: int) -> list[float]:
    """A named shape (``cosine``, ``sine``, ``linear``, ``reverse_linear``, ``zeros``) of ``n``
    weights, plus the ``+N`` offset: sine is ``sin(pi/2 * i/(n-1))`` for i = 0..n-1, cosine
    the same reversed, linear ``i/(n-1)``, reverse_linear reversed, zeros 0."""
    name, _, offset = text.partition("+")
    base = float(offset) if offset else 0.0
    ramp = [i / (n - 1) for i in range(n)]
    values = {"sine": [math.sin(math.pi * r / 2) for r in ramp],
              "cosine": [math.sin(math.pi * r / 2) for r in reversed(ramp)],
              "linear": ramp, "reverse_linear": list(reversed(ramp)), "zeros": [0.0] * n}
    if name not in values:
        raise ValueError(f"{text!r} is neither a list of numbers nor one of {', '.join(SHAPES)} "
                         f"(with an optional +N)")
    return [v + base for v in values[name]]


def parse_weights(text: str, n: int, named: bool = True) -> list[float]:
    """``"1,0.5,,1"`` (an empty item is 0, as in sd-scripts) or a named shape; cut or padded
    with 1.0 to ``n`` weights."""
    if "," not in text and named and not _is_number(text):
        return shape(text.strip(), n)
    try:
        values = [float(s) if s.strip() else 0.0 for s in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r}: comma-separated numbers" + (
            f" or one of {', '.join(SHAPES)}" if named else "")) from None
    return (values + [1.0] * n)[:n]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def block_lr_weights(net: Any, family: str) -> Optional[list[float]]:
    """The per-block learning-rate factors (25 or 23), or None when no lr weight is set."""
    if all(getattr(net, key) is None for key in LR_KEYS):
        return None
    side, mid_n, total = BLOCK_COUNTS[family]
    threshold = net.block_lr_zero_threshold or 0.0
    parts = []
    for key, n in (("down_lr_weight", side), ("mid_lr_weight", mid_n), ("up_lr_weight", side)):
        text = getattr(net, key)
        weights = [1.0] * n if text is None else parse_weights(text, n, key != "mid_lr_weight")
        parts += [w if (text is None or w > threshold) else 0.0 for w in weights]
    pad = [1.0] * ((total - len(parts)) // 2)
    return [*pad, *parts, *pad]


def block_ranks(net: Any, family: str) -> Optional[dict[str, list[float]]]:
    """``{"dims", "alphas", "conv_dims", "conv_alphas"}`` per block (conv_* None without conv
    LoRA), or None when neither block dims nor block lr weights are set. Unset lists are
    network_dim / network_alpha and conv_dim / conv_alpha (unset conv_alpha: the block's conv
    rank) for every block; a block with lr weight 0 gets rank 0 (no LoRA)."""
    weights = block_lr_weights(net, family)
    if net.block_dims is None and weights is None:
        return None
    total = BLOCK_COUNTS[family][2]
    dims = list(net.block_dims or [net.network_dim] * total)
    alphas = list(net.block_alphas or [net.network_alpha] * total)
    conv_dims = net.conv_block_dims or ([net.conv_dim] * total if net.conv_dim else None)
    conv_alphas = None
    if conv_dims is not None:
        conv_dims = list(conv_dims)
        conv_alphas = list(net.conv_block_alphas or (
            [net.conv_alpha] * total if net.conv_alpha is not None else
            [float(d) for d in conv_dims]))
    for i, w in enumerate(weights or []):
        if w == 0:
            dims[i] = 0
            if conv_dims is not None:
                conv_dims[i] = 0
    return {"dims": dims, "alphas": alphas, "conv_dims": conv_dims, "conv_alphas": conv_alphas}


def block_index(kohya_name: str, family: str) -> int:
    """sd-scripts' block of a UNet module, from its kohya name (``lora_unet_...``); -1: none."""
    rules = role(family, "rules") if family in BLOCK_COUNTS else None
    return rules.lora_block_index(kohya_name) if rules is not None else -1


def block_problems(net: Any, family: Optional[str]) -> list[str]:
    """Block lists of the wrong length for the family (unknown family: 23 or 25)."""
    problems = []
    sizes = (BLOCK_COUNTS[family][2],) if family in BLOCK_COUNTS else (23, 25)
    for key in DIM_KEYS:
        values = getattr(net, key)
        if values is not None and len(values) not in sizes:
            counts = " or ".join(str(s) for s in sizes)
            problems.append(f"network.{key} has {len(values)} values; sd-scripts counts "
                            f"{counts} UNet blocks" + (f" for {family}" if family else
                                                       " (SDXL 23, SD 1.x/2.x 25)"))
    lr = any(getattr(net, key) is not None for key in LR_KEYS)
    if net.block_alphas is not None and net.block_dims is None and not lr:
        problems.append("network.block_alphas is set but neither network.block_dims nor a "
                        "block lr weight is (sd-scripts reads it only with them): set one")
    if net.conv_block_dims is not None and net.block_dims is None and not lr:
        problems.append("network.conv_block_dims needs network.block_dims or a block lr weight "
                        "(sd-scripts reads it only with them): set one")
    if net.conv_block_alphas is not None and net.conv_block_dims is None:
        problems.append("network.conv_block_alphas is set but network.conv_block_dims is not: "
                        "set both")
    return problems
