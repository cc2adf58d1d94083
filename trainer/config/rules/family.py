"""Settings that a model family does not read or cannot use, refused with the reason.

A config knows its family when ``model.model_version`` names it or the model is an embedded one;
then these checks run when the config loads. Otherwise the run calls :func:`family_problems`
again once the model is loaded and its family detected, before anything trains, so a FLUX.1
checkpoint given as a path gets the same messages.

Which families read a setting is declared once, by its ``families`` hint (``setting(...,
families=...)`` in trainer/config/sections/): a value other than its default, for a family the
hint leaves out, is refused, naming the setting and the family. What follows from the family's
spec (its objective, its denoiser, textual inversion, LyCORIS) is checked here for every family;
what one family refuses beyond that is its folder's ``rules`` role
(``problems(cfg, spec, precision) -> list[str]``, e.g. FLUX.1's fp16).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

from trainer.families import embedded_family, label, names, role, spec, version_family

# what the messages call an objective's options, and how a family of it trains
OPTIONS = {"ddpm": "a DDPM option", "flow": "a flow-matching option"}
TRAINS = {"ddpm": "a DDPM noise schedule", "flow": "flow matching (the [flow] section)"}
# the sections whose family-bound settings are options of the objective (noise, loss, [flow])
OBJECTIVE_SECTIONS = ("training", "flow")
# the LyCORIS types a transformer family trains (FamilySpec.lycoris): those whose files ComfyUI
# applies onto a slice of a fused layer as they trained (its LoRA, LoHa and LoKr adapters). IA3
# it does not read; DoRA it rescales by the base weight's row norms where lycoris takes the
# updated weight's (comfy/weight_adapter/base.py weight_decompose); GLoRA / BOFT / Diag-OFT are
# not checked against it
TRANSFORMER_LYCORIS = ("locon", "loha", "lokr")
# a setting of one objective whose counterpart the other objective reads
INSTEAD = {"model.prediction_type": "flow.model_prediction_type"}


def known_family(cfg: Any) -> Optional[str]:
    """The family the config names (model_version, or an embedded model); None for auto. A
    variant's name (``qwen_image_edit``) names its family (``qwen_image``)."""
    if cfg.model.model_version != "auto":
        return version_family(cfg.model.model_version)
    return embedded_family(cfg.model.pretrained_model_name_or_path)


@lru_cache(maxsize=1)
def hinted() -> tuple[tuple[str, str, Any, tuple[str, ...]], ...]:
    """(section, name, default, families) of every setting with a ``families`` hint."""
    from trainer.config.sections import SECTIONS

    out = []
    for section, cls in SECTIONS.items():
        for name, info in cls.model_fields.items():
            families = ((info.json_schema_extra or {}).get("ui") or {}).get("families")
            if families is not None:  # an empty hint: no family reads it yet
                out.append((section, name, info.get_default(call_default_factory=True),
                            tuple(families)))
    return tuple(out)


def objective_options(objective: str, section: str) -> dict[str, Any]:
    """``{"<section>.<name>": default}`` of the settings of ``section`` that only the families
    of ``objective`` read (``ddpm``, ``training``: the DDPM noise and loss options)."""
    owners = set(names(objective=objective))
    return {f"{s}.{n}": default for s, n, default, families in hinted()
            if s == section and set(families) == owners}


def _fix(default: Any) -> str:
    return "unset it" if default in (None, False) else f"set it back to {default!r}"


def unread_message(key: str, default: Any, family: str, owners: tuple[str, ...]) -> str:
    """Why ``key`` (a setting of ``owners``' families) is refused for ``family``."""
    from trainer.config.rules.edit import edit_families, not_edit_message

    if set(owners) == set(edit_families()):  # read only by the models that take controls
        return not_edit_message(key, family)
    name, objective = label(family), spec(family).objective
    others = [o for o in OPTIONS if o != objective and set(owners) == set(names(objective=o))]
    if key in INSTEAD and others:
        return f"{key} is {OPTIONS[others[0]]}; for {name} set {INSTEAD[key]} instead"
    if key.split(".")[0] in OBJECTIVE_SECTIONS and others:
        return (f"{key} is {OPTIONS[others[0]]}; {name} trains with {TRAINS[objective]}; "
                f"{_fix(default)}")
    where = " / ".join(dict.fromkeys(label(f) for f in owners))
    return f"{key} is set but {name} does not read it ({where} only); {_fix(default)}"


def hint_problems(cfg: Any, family: str) -> list[str]:
    """Each setting whose ``families`` hint leaves ``family`` out and that holds another value
    than its default."""
    problems = []
    for section, name, default, owners in hinted():
        if family in owners or getattr(getattr(cfg, section), name) == default:
            continue
        problems.append(unread_message(f"{section}.{name}", default, family, owners))
    return problems


def lycoris_problems(net: Any, s: Any) -> list[str]:
    """The LyCORIS type ``network.network_type`` on a family: none where the spec has no
    ``lycoris``; on a transformer, the types whose files ComfyUI applies to the original fused
    layers (trainer/export/flow_lycoris.py), on the LoRA's own targets (no lycoris preset)."""
    if not s.lycoris:
        return [f"network.network_type = {net.network_type!r}: the LyCORIS types are not "
                f"available for {s.label} yet; use 'lora'"]
    if s.denoiser != "transformer":
        return []
    if net.network_type not in TRANSFORMER_LYCORIS:
        return [f"network.network_type = {net.network_type!r} is not available for {s.label}; "
                f"its LyCORIS types are {', '.join(TRANSFORMER_LYCORIS)} (or 'lora')"]
    if net.lycoris_preset is not None:
        return [f"network.lycoris_preset = {net.lycoris_preset!r} names the blocks of UNet "
                f"models; {s.label}'s LyCORIS adapts the modules of its LoRA "
                f"(network.train_blocks): unset lycoris_preset"]
    return []


def spec_problems(cfg: Any, family: str) -> list[str]:
    """What the family's spec rules out: textual inversion, the LyCORIS types, the Huber
    schedule of DDPM's SNR on flow matching, T5 trained without the text-encoder rate."""
    s, net, tr = spec(family), cfg.network, cfg.training
    name = s.label
    problems = []
    if s.objective == "flow" and tr.loss_type in ("huber", "smooth_l1") \
            and tr.huber_schedule == "snr":
        problems.append(f"training.huber_schedule = 'snr' needs a DDPM noise schedule; {name} "
                        f"trains with flow matching: use 'constant' or 'exponential'")
    if cfg.mode == "lora" and net.network_type != "lora":
        problems += lycoris_problems(net, s)
    if cfg.mode == "lora" and net.network_type == "lora" and net.network_weights \
            and s.denoiser == "transformer" and not s.continues_lora:
        problems.append(f"network.network_weights: continuing a LoRA is not available for "
                        f"{name} yet (the LyCORIS types {', '.join(TRANSFORMER_LYCORIS)} "
                        f"continue from their file); unset it")
    if cfg.mode == "lora" and s.train_blocks and net.train_blocks not in s.train_blocks:
        problems.append(f"network.train_blocks = {net.train_blocks!r}: {name}'s blocks are "
                        f"{', '.join(repr(b) for b in s.train_blocks)}")
    if s.has_t5 and net.train_t5xxl and not net.train_text_encoder:
        problems.append("network.train_t5xxl needs network.train_text_encoder (T5 trains with "
                        "the text-encoder learning rate); turn it on or unset train_t5xxl")
    return problems


def family_problems(cfg: Any, family: str, precision: Optional[str] = None) -> list[str]:
    """What ``cfg`` asks of a ``family`` model that it cannot do; ``precision`` is the resolved
    mixed precision when known (the run), else ``training.mixed_precision``."""
    from trainer.config.rules.network import network_extra_problems  # LoRA+, block-wise, ...

    s = spec(family)
    problems = network_extra_problems(cfg.network, family) if cfg.mode == "lora" else []
    if cfg.mode == "textual_inversion" and not s.textual_inversion:
        problems.append(f"mode = 'textual_inversion' is not available for {s.label}: its "
                        f"prompts go through T5 as well as CLIP, and the tools that load "
                        f"embeddings do not read one for these models; train a LoRA instead")
    rules = role(family, "rules")
    if rules is not None and hasattr(rules, "problems"):
        problems += rules.problems(cfg, s, precision)
    return problems + hint_problems(cfg, family) + spec_problems(cfg, family)


def problems(cfg: Any) -> list[str]:
    """The problems of the family the config names; none when it names none."""
    family = known_family(cfg)
    return [] if family is None else family_problems(cfg, family)


def trains_t5(cfg: Any) -> bool:
    """Whether a run of ``cfg`` trains T5-XXL: ``network.train_t5xxl`` with
    ``train_text_encoder`` where T5 sits beside CLIP (FLUX.1, SD 3.5); where T5 is the
    family's only text encoder (Chroma), ``train_text_encoder`` alone, as for any family's
    one text encoder."""
    from trainer.families import family_or_none

    net = cfg.network
    if not net.train_text_encoder or net.train_t5xxl:
        return net.train_text_encoder and net.train_t5xxl
    family = known_family(cfg) or family_or_none(cfg.model.pretrained_model_name_or_path)
    return family is not None and spec(family).text_encoders == ("t5xxl",)
