"""kohya_ss's DyLoRA types (``Kohya DyLoRA``, ``LyCORIS/DyLoRA``) and their ``unit``.

Both train here as sd-scripts' ``networks.dylora`` does (trainer/methods/dylora.py): a plain
LoRA at ``network_dim`` with ``network.dylora_unit``. For ``Kohya DyLoRA`` kohya_ss passes
``conv_dim``, ``conv_alpha``, the block-wise keys, the dropouts and ``unit`` (each when set); of
these networks.dylora reads conv_dim (which must equal network_dim) and unit, so the rest is
"not needed", as sd-scripts ignores it. ``LyCORIS/DyLoRA`` is lycoris' DyLoraModule
(``block_size`` = unit), which fails on convolutions and whose files do not load back in its
own loader: it becomes the same network, with a note, and a lycoris option that networks.dylora
cannot honour (a preset, Tucker, norm layers, dropout) is reported as not supported.
"""

from __future__ import annotations

from trainer.importers.kohya import convert as c
from trainer.importers.kohya.report import Ctx

DYLORA_TYPES = ("Kohya DyLoRA", "LyCORIS/DyLoRA")
_NOT_READ = "sd-scripts' networks.dylora does not read it"
# kohya_ss keys that DIRECT maps for LoRA and networks.dylora ignores
# (trainer/config/rules/dylora.py refuses them with dylora_unit)
IGNORED = {
    **dict.fromkeys(("down_lr_weight", "mid_lr_weight", "up_lr_weight",
                     "block_lr_zero_threshold", "block_dims", "block_alphas", "conv_block_dims",
                     "conv_block_alphas"), f"{_NOT_READ} (block-wise keys are networks.lora's)"),
    "scale_weight_norms": "sd-scripts turns max-norm off for networks.dylora (it has none)",
}
_LYCORIS_ONLY = {"LyCORIS_preset": ("full",), "use_tucker": (False,), "train_norm": (False,),
                 "rank_dropout": (0.0,), "module_dropout": (0.0,)}


def _value(ctx: Ctx, key: str):
    raw = ctx.raw(key)
    if key == "LyCORIS_preset":
        return c.UNSET if c.is_empty(raw) else str(raw)
    return c.to_bool(raw) if key in ("use_tucker", "train_norm") else (ctx.num(key) or 0.0)


def _drop_direct(ctx: Ctx) -> None:
    """Undo what table.DIRECT mapped for a key networks.dylora ignores."""
    for key, reason in IGNORED.items():
        if key not in ctx.data:
            continue
        targets = [t for k, _, t, _ in ctx.report.mapped if k == key]
        ctx.report.mapped = [m for m in ctx.report.mapped if m[0] != key]
        for target in targets:
            ctx.out.get("network", {}).pop(target.partition(".")[2], None)
        if key in ctx.report.unset:
            continue
        ctx.skip(key, reason)


def dylora_network(ctx: Ctx, name: str, keys: tuple[str, ...]) -> None:
    """Record every one of ``keys`` (the network handler's) present in the file."""
    lycoris = name == "LyCORIS/DyLoRA"
    ctx.set("LoRA_type", "network.network_type", "lora")
    unit = c.to_int(ctx.raw("unit")) if not c.is_empty(ctx.raw("unit")) else 0
    ctx.set("unit" if "unit" in ctx.data else "LoRA_type", "network.dylora_unit", unit or 1)
    if lycoris:
        ctx.note("LoRA_type", "trained as sd-scripts' networks.dylora (plain LoRA files at "
                              "network_dim); lycoris' DyLoraModule fails on convolutions and "
                              "its files do not load back in its own loader")
    dim = ctx.num("network_dim")
    for key in keys:
        if key in ("LoRA_type", "unit") or key not in ctx.data:
            continue
        value = ctx.num(key) if key in ("network_dim", "network_alpha", "conv_dim") else None
        if key in ("network_dim", "network_alpha"):
            ctx.set(key, f"network.{key}", int(value) if key == "network_dim" else value) \
                if value else ctx.unset(key)
        elif key == "conv_dim" and value and dim and int(value) != int(dim):
            ctx.refuse(key, f"networks.dylora adapts the 3x3 convolutions only at network_dim "
                            f"({int(dim)})") if lycoris else ctx.set(key, "network.conv_dim",
                                                                      int(value))
        elif key == "conv_dim":
            ctx.set(key, "network.conv_dim", int(value)) if value else ctx.unset(key)
        elif key == "conv_alpha":
            ctx.skip(key, "networks.dylora trains the convolutions at network_alpha")
        elif lycoris and key in _LYCORIS_ONLY:
            v = _value(ctx, key)
            ctx.unset(key) if v is c.UNSET or v in _LYCORIS_ONLY[key] else \
                ctx.refuse(key, "a lycoris DyLoRA option; DyLoRA trains here as sd-scripts' "
                                "networks.dylora, which has none")
        elif key in ("rank_dropout", "module_dropout", "network_dropout"):
            ctx.skip(key, f"{_NOT_READ} (its DyLoRAModule has no dropout)") if ctx.num(key) \
                else ctx.unset(key)
        elif key == "dim_from_weights" and c.to_bool(ctx.raw(key)) is True:
            ctx.refuse(key, "sd-scripts rebuilds a DyLoRA network from a file with unit 1; "
                            "set network_dim to the file's rank")
        elif key == "dim_from_weights":
            ctx.unset(key)
        else:
            ctx.skip(key, f"kohya_ss does not pass it for LoRA_type {name!r}")
    _drop_direct(ctx)
