"""kohya_ss's ``LoRA_type`` with its rank and LyCORIS keys, and the optimizer with its
``optimizer_args`` text.

What kohya_ss passes for each LoRA_type follows its lora_gui.train_model (the network_args it
builds per type); a key it does not pass for the chosen type is reported as not needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from trainer.config import SECTIONS, OptimizerSection
from trainer.config.rules.network import NETWORK_OPTIONS
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.dylora import DYLORA_TYPES, dylora_network
from trainer.importers.kohya.lycoris import lycoris_preset, text_encoder_off, unused_conv_keys
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import Rule, optimizer_target


@dataclass(frozen=True)
class NetType:
    network_type: str  # our network.network_type
    conv: bool  # kohya_ss passes conv_dim / conv_alpha
    extras: tuple[str, ...]  # the LyCORIS keys kohya_ss passes
    rank: bool = True  # network_dim / network_alpha mean something
    ignored: tuple[str, ...] = ()  # keys kohya_ss passes that the lycoris module never reads


_DROP = ("rank_dropout", "module_dropout")
_PRESET = ("LyCORIS_preset",)  # kohya_ss passes preset= for every lycoris.kohya type
_LYCO = _DROP + ("train_norm", "use_tucker", "use_scalar", "dora_wd", "bypass_mode") + _PRESET
LORA_TYPES: dict[str, NetType] = {
    "Standard": NetType("lora", False, _DROP),
    "Flux1": NetType("lora", False, _DROP),  # networks.lora_flux (flow.py: the rest)
    "Kohya LoCon": NetType("lora", True, _DROP),
    "LoCon": NetType("locon", True, _LYCO),
    "LyCORIS/LoCon": NetType("locon", True, _LYCO),
    "LyCORIS/DoRA": NetType("dora", True, _LYCO),
    "LyCORIS/LoHa": NetType("loha", True, _LYCO),
    "Kohya LoHa": NetType("loha", True, _DROP + ("use_tucker",)),
    "LyCORIS/LoKr": NetType("lokr", True, _LYCO + ("factor", "decompose_both", "use_cp")),
    "Kohya LoKr": NetType("lokr", True, _DROP + ("use_tucker", "factor")),
    "LyCORIS/iA3": NetType("ia3", False, ("train_on_input",) + _PRESET, rank=False,
                           ignored=("train_on_input",)),
    # lycoris/modules/glora.py, boft.py, diag_oft.py: what each reads of kohya_ss' arguments
    "LyCORIS/GLoRA": NetType("glora", True, _DROP + ("train_norm", "use_tucker") + _PRESET,
                             ignored=("use_tucker",)),
    "LyCORIS/BOFT": NetType("boft", True, _DROP + ("train_norm", "use_tucker") + _PRESET,
                            ignored=("rank_dropout", "use_tucker")),
    "LyCORIS/Diag-OFT": NetType("diag-oft", True, _DROP + ("train_norm", "use_tucker",
                                                           "constrain", "rescaled") + _PRESET,
                                ignored=("use_tucker",)),
}
IGNORED_WHY = {  # a key kohya_ss passes and lycoris never reads, why (default: the module)
    "train_on_input": "lycoris.kohya's create_network does not read it; lycoris' ia3 preset "
                      "sets train_on_input on the feed-forward output layers (ff.net.2, "
                      "mlp.fc2), as network_type 'ia3' does here",
}
NOT_TRAINED = ("LyCORIS/Native Fine-Tuning", "LoRA-FA", "Flux1 OFT")
WHY_NOT: dict[str, str] = {}  # LoRA_type -> why it is not trained, for the message

EXTRA_TARGETS = {  # kohya key -> (our key, converter)
    "rank_dropout": ("network.rank_dropout", c.nonzero(c.to_float)),
    "module_dropout": ("network.module_dropout", c.nonzero(c.to_float)),
    "train_norm": ("network.train_norm", c.to_bool),
    "use_tucker": ("network.use_tucker", c.to_bool),
    "use_cp": ("network.use_tucker", c.to_bool),  # LyCORIS's old name of use_tucker
    "use_scalar": ("network.use_scalar", c.to_bool),
    "factor": ("network.factor", lambda v: c.UNSET if c.to_int(v) == -1 else c.to_int(v)),
    "decompose_both": ("network.decompose_both", c.to_bool),
    "train_on_input": ("network.train_on_input", c.to_bool),
    "constrain": ("network.constraint", c.nonzero(c.to_float)),  # lycoris' constraint
    "rescaled": ("network.rescaled", c.to_bool),
    "LyCORIS_preset": ("network.lycoris_preset", lycoris_preset),
    "bypass_mode": ("network.bypass_mode", c.to_bool),
}
NETWORK_KEYS = ("LoRA_type", "network_dim", "network_alpha", "conv_dim", "conv_alpha",
                "network_dropout", "dora_wd", *EXTRA_TARGETS, "dim_from_weights", "unit")


def upper_bound(target: str) -> float | None:
    """The schema's ``le`` bound of a dotted key, if any."""
    section, _, name = target.partition(".")
    field = SECTIONS[section].model_fields.get(name)
    for meta in getattr(field, "metadata", ()):
        if getattr(meta, "le", None) is not None:
            return meta.le
    return None


def network(ctx: Ctx) -> None:
    present = [k for k in NETWORK_KEYS if k in ctx.data]
    if ctx.mode != "lora":
        for key in present:
            ctx.skip(key, f"a LoRA setting, not used in {ctx.mode} mode")
        return
    name = ctx.raw("LoRA_type") or "Standard"
    if name in DYLORA_TYPES:  # sd-scripts' networks.dylora (dylora.py)
        dylora_network(ctx, name, NETWORK_KEYS)
        return
    if "unit" in ctx.data:
        ctx.skip("unit", f"DyLoRA's rank step; kohya_ss does not pass it for LoRA_type {name!r}")
    if name in NOT_TRAINED or name not in LORA_TYPES:
        known = ", ".join((*LORA_TYPES, *DYLORA_TYPES))
        why = f" ({WHY_NOT[name]})" if name in WHY_NOT else ""
        ctx.problems.append(f"LoRA_type = {name!r}: not trained by this studio{why}; choose one "
                            f"of {known}")
        return
    kind = LORA_TYPES[name]
    dora = kind.network_type == "locon" and c.to_bool(ctx.raw("dora_wd")) is True
    net_type = "dora" if dora else kind.network_type
    if "network.network_type" in ctx.paths:
        ctx.set("LoRA_type", "network.network_type", net_type)
    elif net_type != "lora":
        ctx.problems.append(f"LoRA_type = {name!r}: needs network.network_type = "
                            f"{net_type!r}, which this version of the schema lacks")
        return
    elif "LoRA_type" in ctx.data:
        ctx.unset("LoRA_type")
    if dora:
        ctx.set("dora_wd", "network.network_type", "dora")
        ctx.note("dora_wd", "LoCon with weight decomposition is network_type = 'dora'")
    _rank(ctx, kind, net_type, unused_conv_keys(ctx) if "LyCORIS_preset" in kind.extras else {})
    for key in EXTRA_TARGETS:
        if key not in ctx.data:
            continue
        if key not in kind.extras:
            ctx.skip(key, f"kohya_ss does not pass it for LoRA_type {name!r}")
            continue
        if key in kind.ignored:
            ctx.skip(key, IGNORED_WHY.get(key, f"lycoris' {net_type} module does not read it"))
            continue
        if key == "LyCORIS_preset" and net_type == "ia3" and ctx.raw(key) == "ia3":
            ctx.unset(key)  # network_type 'ia3' is lycoris' ia3 preset
            continue
        target, convert = EXTRA_TARGETS[key]
        if _unused_here(target, net_type):
            _refuse_if_on(ctx, key, convert, f"network_type {net_type!r} has no {target} here")
        else:
            ctx.apply(key, Rule(target, convert))
    _dim_from_weights(ctx)
    text_encoder_off(ctx)
    if "dora_wd" in ctx.data and not dora:
        on = c.to_bool(ctx.raw("dora_wd")) is True
        ctx.refuse("dora_wd", f"DoRA with {name} is not supported (only with LoCon)") if on \
            else ctx.unset("dora_wd")


def _dim_from_weights(ctx: Ctx) -> None:
    """kohya_ss saves the checkbox whatever the file field says; sd-scripts reads it only with
    network_weights."""
    if "dim_from_weights" not in ctx.data:
        return
    on = c.to_bool(ctx.raw("dim_from_weights")) is True
    files = [k for k in ("network_weights", "lora_network_weights")
             if not c.is_empty(ctx.raw(k))]
    if on and files:
        ctx.set("dim_from_weights", "network.dim_from_weights", True)
    elif on:
        ctx.skip("dim_from_weights", "sd-scripts reads it only with network_weights, which "
                                     "the file leaves empty")
    else:
        ctx.unset("dim_from_weights")


def _unused_here(target: str, net_type: str) -> bool:
    """config_rules.NETWORK_OPTIONS: the options that only some network types read."""
    name = target.partition(".")[2]
    return name in NETWORK_OPTIONS and net_type not in NETWORK_OPTIONS[name]


def _refuse_if_on(ctx: Ctx, key: str, convert: Any, reason: str) -> None:
    try:
        value = convert(ctx.raw(key))
    except ValueError as exc:
        ctx.problems.append(f"{key} = {ctx.raw(key)!r}: {exc}")
        return
    if value is c.UNSET or value is False or (key == "factor" and value == -1):
        ctx.unset(key)
    else:
        ctx.refuse(key, reason)


def _rank(ctx: Ctx, kind: NetType, net_type: str, unused: dict[str, str]) -> None:
    pairs = [("network_dim", "network.network_dim", kind.rank),
             ("network_alpha", "network.network_alpha", kind.rank),
             ("conv_dim", "network.conv_dim", kind.conv),
             ("conv_alpha", "network.conv_alpha", kind.conv),
             ("network_dropout", "network.network_dropout", kind.rank)]
    for key, target, used in pairs:
        if key not in ctx.data:
            continue
        value = ctx.num(key)
        if key in unused:
            ctx.skip(key, unused[key])
        elif not used or _unused_here(target, net_type):
            ctx.skip(key, f"not used by network_type {net_type!r} (kohya_ss passes no value)")
        elif not value:
            ctx.unset(key)
        elif key.endswith("_dim"):
            ctx.set(key, target, _dim(ctx, key, target, int(value), net_type))
        else:
            ctx.set(key, target, value)


def _dim(ctx: Ctx, key: str, target: str, value: int, net_type: str) -> int:
    """LoKr presets use a huge dim (100000) to ask for full Kronecker factors: LyCORIS trains a
    factor in full when the dim reaches half its side, so the schema's largest dim asks the
    same for every SD layer."""
    top = upper_bound(target)
    if net_type == "lokr" and top is not None and value > top:
        ctx.note(key, f"{value} becomes {int(top)}, the largest here: LoKr trains its factors "
                      f"in full at either value")
        return int(top)
    return value


# sd-scripts passes no weight_decay when optimizer_args has none, so the optimizer's own
# default applies: torch AdamW and bitsandbytes' AdamW variants 1e-2; Lion (lion-pytorch,
# bitsandbytes), transformers' Adafactor, prodigyopt, dadaptation, SGD and schedulefree 0.
DEFAULT_WEIGHT_DECAY = {
    **dict.fromkeys(("AdamW", "AdamW8bit", "PagedAdamW", "PagedAdamW8bit"), 0.01),
    **dict.fromkeys(("Lion", "Lion8bit", "PagedLion8bit", "Adafactor", "Prodigy", "DAdaptAdam",
                     "DAdaptation", "DAdaptLion", "DAdaptAdaGrad", "DAdaptSGD", "SGDNesterov",
                     "SGDNesterov8bit", "AdamWScheduleFree", "SGDScheduleFree"), 0.0),
}


def optimizer(ctx: Ctx) -> None:
    name = c.to_text(ctx.raw("optimizer")) if "optimizer" in ctx.data else c.UNSET
    if name is not c.UNSET:
        ctx.set("optimizer", *optimizer_target(name))
    elif "optimizer" in ctx.data:
        ctx.unset("optimizer")
    try:
        args = c.key_values(ctx.raw("optimizer_args"))
    except ValueError as exc:
        ctx.problems.append(f"optimizer_args = {ctx.raw('optimizer_args')!r}: {exc}")
        return
    decay = args.pop("weight_decay", None)
    if decay is not None:
        ctx.set("optimizer_args", "optimizer.weight_decay", c.to_float(decay))
    elif name in DEFAULT_WEIGHT_DECAY:
        ctx.set("optimizer", "optimizer.weight_decay", DEFAULT_WEIGHT_DECAY[name])
        ctx.note("optimizer", f"no weight_decay in optimizer_args: {name}'s own default "
                              f"({DEFAULT_WEIGHT_DECAY[name]:g}), as sd-scripts would use")
    kept = {k: v for k, v in args.items() if _accepted(k, v)}
    for key, value in args.items():
        if key not in kept:
            ctx.refuse("optimizer_args", f"{key}={value!r}: optimizer.optimizer_args does "
                       f"not take this value", f"{key}={value!r}")
    if kept:
        ctx.set("optimizer_args", "optimizer.optimizer_args", kept)
    elif "optimizer_args" in ctx.data and decay is None and not args:
        ctx.unset("optimizer_args")


def _accepted(key: str, value: Any) -> bool:
    try:
        OptimizerSection(optimizer_args={key: value})
    except ValidationError:
        return False
    return True
