"""A raw ``network_args`` key in a kohya_ss file (sd-scripts' --network_args text)."""

from __future__ import annotations

from typing import Any

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.network_options import NETWORK_DIRECT
from trainer.importers.kohya.table import DIRECT


def network_args(ctx: Any) -> None:
    """A raw ``network_args`` ("key=value" items, as sd-scripts' --network_args): kohya_ss's
    LoRA, DreamBooth and finetune tabs never save one (they build it from their own keys); a
    file that has one (the LECO tab's text box, a hand-written file) gets each item mapped like
    the key of that name above, and any other item reported naming its key."""
    raw = ctx.raw("network_args")
    items = raw if isinstance(raw, list) else ("" if c.is_empty(raw) else str(raw)).split()
    items = [str(i).strip().strip('"') for i in items if str(i).strip()]
    if not items:
        ctx.unset("network_args")
        return
    for item in items:
        key, sep, value = item.partition("=")
        label = f"network_args {key}"
        if sep and key in NETWORK_DIRECT and ctx.mode == "lora":
            ctx.apply(label, DIRECT[key], value)
        else:
            ctx.refuse(label, f"a network argument this importer does not map from "
                              f"network_args; kohya_ss's form keys (conv_dim, rank_dropout, "
                              f"LoRA_type, ...) are mapped, set {key!r} there",
                       raw=value)
