"""kohya_ss's keys of the flow-matching families (FLUX.1, SD3): the family switch, the
component files, the flow-matching settings, and what this studio does not do yet.

Each family's own keys are its ``kohya`` role's (``trainer/families/<folder>/kohya.py``):
``SWITCHES`` and ``LORA_TYPES`` (what picks it), ``RULES`` (the keys that map), ``ENCODER_FILES``
(the tab's key of each text-encoder file), ``UNSUPPORTED`` / ``NOT_NEEDED`` (with the reasons),
``ONLY`` (every key kohya_ss passes with its switch only), ``TIMESTEP_RANGE`` (whether its
sd-scripts trainer reads min / max_timestep), ``finish(ctx)`` (what its trainer does that the
file does not say) and optionally ``HANDLERS``, ``OFF_VALUES``, ``swap_units`` and ``SELECT``
(the values that pick it among the families of one switch: Chroma's ``model_type``).

kohya_ss (lora_gui / dreambooth_gui ``train_model``) passes each of these keys to sd-scripts only
with its family's switch; a key of another family (or of any, in an SD file) is reported as not
needed. Its two tabs name the text-encoder files differently, so the key read is the family's
own for the file's tab. sd-scripts' flow trainers read none of the DDPM options (noise offset,
min-SNR, timestep range for FLUX.1...): those the kohya_ss form still saves are reported as not
needed instead of imported, as the config would refuse them (trainer/config/rules/family.py).
The memory options (fp8 base weights, block swap) are memory.py's.
"""

from __future__ import annotations

from typing import Any

from trainer.config.rules.family import objective_options
from trainer.families import label
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.families import roles, switches
from trainer.importers.kohya.report import Ctx, is_off
from trainer.importers.kohya.table import Rule

ROLES = roles("flow")  # {family: its kohya role}
SWITCHES = switches("flow")  # {family: its switch keys}
# the keys kohya_ss's form saves for every flow family
NOT_NEEDED: dict[str, str] = dict.fromkeys(("show_timesteps", "show_timesteps_resolution"),
                                           "a kohya_ss preview of the timestep distribution")
BOTH = ("clip_l", "t5xxl", "blocks_to_swap", "show_timesteps", "show_timesteps_resolution")
# the memory options: memory.py reads them (with the family this module finds)
MEMORY_KEYS = ("fp8_base", "fp8_base_unet", "blocks_to_swap", "single_blocks_to_swap",
               "double_blocks_to_swap", "split_mode")
_SWITCH_KEYS = tuple(k for keys in SWITCHES.values() for k in keys)
KEYS = tuple(k for k in dict.fromkeys((*_SWITCH_KEYS, *(k for r in ROLES.values()
                                                         for k in r.ONLY), *BOTH))
             if k not in MEMORY_KEYS)


def family_of(data: dict[str, Any]) -> str | None:
    """The flow family a kohya_ss file trains, or None."""
    found = [fam for fam, r in ROLES.items()
             if (any(c.to_bool(data.get(key, False)) is True for key in SWITCHES.get(fam, ()))
                 or data.get("LoRA_type") in r.LORA_TYPES)
             and all(data.get(k) in v for k, v in getattr(r, "SELECT", {}).items())]
    # a family that a value selects within a shared switch (Chroma: FLUX.1's tab with
    # model_type "chroma") is it, rather than the switch's own family
    found = [f for f in found if getattr(ROLES[f], "SELECT", None)] or found
    if len(found) > 1:
        raise ValueError(f"{' and '.join(SWITCHES[f][0] for f in found)} are both on: a model "
                         f"is one or the other")
    return found[0] if found else None


def flow(ctx: Ctx) -> None:
    """Every key of the flow families in the file: mapped, or reported with the reason."""
    try:
        family = family_of(ctx.data)
    except ValueError as exc:
        ctx.problems.append(str(exc))
        return
    for key in (k for k in dict.fromkeys(_SWITCH_KEYS) if k in ctx.data):
        ctx.set(key, "model.model_version", family) if key in SWITCHES.get(family, ()) \
            else ctx.unset(key)
    others = [k for k in KEYS if k in ctx.data and k not in _SWITCH_KEYS]
    if family is None:
        for key in others:
            ctx.skip(key, not_passed(key))
        return
    role = ROLES[family]
    _drop_sdxl_cache(ctx)
    _encoder_files(ctx, family)
    for key in [k for k in others if k not in ctx.report.keys()]:
        if key in role.ONLY or key in BOTH:
            _owned_key(ctx, key, family)
        else:
            ctx.skip(key, not_passed(key))
    role.finish(ctx)
    drop_ddpm_options(ctx, family)


def not_passed(key: str) -> str:
    """Why a flow family's key is not needed: kohya_ss passes it with its family's switch."""
    mine = [f for f, r in ROLES.items() if f in SWITCHES and (key in r.ONLY or key in BOTH)]
    switch = " / ".join(dict.fromkeys(SWITCHES[f][0] for f in mine))
    return f"a {' / '.join(label(f) for f in mine)} setting; kohya_ss passes it only with {switch}"


def _drop_sdxl_cache(ctx: Ctx) -> None:
    """kohya_ss passes sdxl_cache_text_encoder_outputs only with sdxl: the family's own cache
    switch decides (mapped after this)."""
    key = "sdxl_cache_text_encoder_outputs"
    for entry in [m for m in ctx.report.mapped if m[0] == key]:
        ctx.report.mapped.remove(entry)
        ctx.report.same_as_default.discard(key)
        ctx.out.get("dataset", {}).pop("cache_text_encoder_outputs", None)
        ctx.skip(key, "an SDXL setting; kohya_ss passes it only with sdxl")


def _encoder_files(ctx: Ctx, family: str) -> None:
    """The family's text-encoder files under the tab's key; another flow family's key for the
    same file is not needed (its own switch would pass it)."""
    for target, keys in ROLES[family].ENCODER_FILES.items():
        mine = next((k for k in keys if k in ctx.data), None)
        if mine is None:
            continue
        ctx.apply(mine, Rule(target, c.to_text))
        for other, role in ROLES.items():
            for key in role.ENCODER_FILES.get(target, ()) if other != family else ():
                if key in ctx.data and key not in ctx.report.keys():
                    ctx.skip(key, f"the {label(other)} file in this kohya_ss tab; kohya_ss "
                                  f"passes it only with its switch")


def _owned_key(ctx: Ctx, key: str, family: str) -> None:
    role = ROLES[family]
    value = ctx.data[key]
    not_needed = {**NOT_NEEDED, **role.NOT_NEEDED}
    handlers = getattr(role, "HANDLERS", {})
    if key in role.RULES:
        ctx.apply(key, role.RULES[key])
    elif key in not_needed:
        ctx.skip(key, not_needed[key])
    elif key in role.UNSUPPORTED:
        off = is_off(value) or value in getattr(role, "OFF_VALUES", {}).get(key, ())
        ctx.unset(key) if off else ctx.refuse(key, role.UNSUPPORTED[key])
    elif key in handlers:
        handlers[key](ctx, key)
    else:
        ctx.skip(key, not_passed(key))


# The SD families' prompt options (trainer/data/weighted captions, long prompts): the value
# that means "off"; the kohya_ss form saves them for every family
SD_PROMPT_OPTIONS = {"dataset.max_token_length": None, "dataset.weighted_captions": False,
                     "dataset.no_token_padding": False}


def drop_ddpm_options(ctx: Ctx, family: str) -> None:
    """The DDPM options that the file set (mapped by the SD rules) are not read by sd-scripts'
    flow trainers: move them from the config to "not needed" (the timestep range of a family
    whose sd-scripts trainer reads it, SD3's, is refused unless it is the full 0-1000)."""
    name, reads_range = label(family), ROLES[family].TIMESTEP_RANGE
    targets = {**objective_options("ddpm", "training"), **objective_options("ddpm", "sampling")}
    targets["model.prediction_type"] = None
    targets.update(SD_PROMPT_OPTIONS)
    for entry in list(ctx.report.mapped):
        key, raw, target, value = entry
        if target not in targets or value == targets[target]:
            continue
        section, _, field = target.partition(".")
        ctx.out.get(section, {}).pop(field, None)
        ctx.targets.pop(target, None)
        ctx.report.mapped.remove(entry)
        ctx.report.same_as_default.discard(key)
        if reads_range and target == "training.max_timestep" and value == 1000:
            ctx.skip(key, "the full range: flow matching samples all of it here")
        elif reads_range and target in ("training.min_timestep", "training.max_timestep"):
            ctx.refuse(key, f"a narrower timestep range for {name} (flow matching samples the "
                            "whole range here)", raw)
        elif target in SD_PROMPT_OPTIONS:
            ctx.skip(key, f"a CLIP prompt option of the SD families; {name} reads 77 CLIP "
                          f"tokens and model.t5xxl_max_token_length T5 tokens")
        else:
            ctx.skip(key, f"a DDPM option; {name} trains with flow matching and sd-scripts' "
                          f"{name} trainer does not read it either")
