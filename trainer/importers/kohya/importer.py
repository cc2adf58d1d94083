"""The importer's entry point: a kohya_ss GUI JSON config (github.com/bmaltais/kohya_ss) as a
validated TrainConfig (the package re-exports these names).

    cfg, report = import_kohya_file("my_lora.json")          # mode from the file
    cfg, report = import_kohya(json.loads(text), mode="dreambooth", source="x.json")

The mode comes from the file: the LoRA tab's keys (LoRA_type, network_dim...) give ``lora``,
the finetune tab's (image_folder, train_dir...) ``dreambooth`` (whole-model training; noted),
the DreamBooth tab's ``dreambooth`` and the textual-inversion tab's (token_string)
``textual_inversion``; ``mode`` overrides it. Files for families this studio does not train
(HunyuanImage, Anima, Lumina) are refused naming the key;
FLUX.1 and SD3 files import (flow.py). Every key of the file lands in the report:
imported (table.DIRECT, derived.DERIVED), left at the default, not supported or not
needed (each with its reason), or unknown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.config import MODES, TrainConfig
from trainer.config import files as config_io
from trainer.config.files import ConfigError
from trainer.families import FAMILIES
from trainer.importers.kohya.derived import DERIVED
from trainer.importers.kohya.report import Ctx, ImportReport, is_off
from trainer.importers.kohya.table import (
    DIRECT,
    FAMILY_LORA_TYPES,
    FAMILY_REASON,
    FAMILY_SWITCHES,
    NOT_NEEDED,
    NOT_SUPPORTED,
    OFF_VALUES,
    is_family_key,
)

__all__ = ["ImportReport", "detect_mode", "import_kohya", "import_kohya_file", "read_json"]

_MARKERS = (  # (mode, keys only that kohya_ss tab saves, note)
    ("textual_inversion", ("token_string", "num_vectors_per_token"), None),
    ("lora", ("LoRA_type", "network_dim", "network_alpha", "text_encoder_lr", "unet_lr"), None),
    ("dreambooth", ("image_folder", "train_dir", "create_buckets", "use_latent_files",
                    "dataset_repeats"),
     "a kohya_ss finetune config: imported as dreambooth (the whole model trains; no class "
     "images). The images directly in image_folder train dataset_repeats times per epoch "
     "(dataset.dataset_repeats); their captions come from the caption files beside them, "
     "from which kohya_ss builds its metadata JSON"),
    ("dreambooth", ("learning_rate_te", "learning_rate_te1", "no_token_padding"), None),
)


def read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object of a kohya_ss config file; errors name the file (and line)."""
    path = Path(path).expanduser()
    text = config_io.read_config_text(path, encoding="utf-8-sig")  # kohya_ss on Windows: BOM
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError([f"not valid JSON: {exc.msg} at line {exc.lineno}, column "
                           f"{exc.colno}"], str(path)) from None
    except RecursionError:
        raise ConfigError([f"not valid JSON here: nested more than {config_io.MAX_DEPTH} "
                           "levels deep"], str(path)) from None
    config_io.check_values(data, str(path))
    if not isinstance(data, dict):
        raise ConfigError(["a kohya_ss config is a JSON object ({...}), not a "
                           f"{type(data).__name__}"], str(path))
    return data


def detect_mode(data: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(mode, note) from the keys that only one kohya_ss tab saves; (None, None) if unsure."""
    for mode, keys, note in _MARKERS:
        if any(k in data for k in keys):
            return mode, note
    return None, None


def refuse_other_families(data: Mapping[str, Any], source: str) -> None:
    """One clear error for a file of a family this studio does not train (HunyuanImage...),
    naming the key and value."""
    found = []
    lora_type = data.get("LoRA_type")
    if isinstance(lora_type, str) and lora_type in FAMILY_LORA_TYPES:
        found.append(("LoRA_type", lora_type, FAMILY_LORA_TYPES[lora_type]))
    for key, family in FAMILY_SWITCHES.items():
        if data.get(key) in (True, "true", "True"):
            found.append((key, data[key], family))
    if found:
        key, value, family = found[0]
        raise ConfigError([f"{key} = {json.dumps(value)}: a {family} config; this studio trains "
                           f"{_trained()} only, so it cannot be imported"], source)


def _trained() -> str:
    """The families' labels, "SD 1.x, SD 2.x, ... and SD 3.5"."""
    labels = list(dict.fromkeys(s.label for s in FAMILIES.values()))
    return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else labels[0]


def import_kohya(data: Mapping[str, Any], mode: str | None = None,
                 source: str = "kohya_ss config") -> tuple[TrainConfig, ImportReport]:
    """A validated TrainConfig and the report of what became of every key."""
    if mode is not None and mode not in MODES:
        raise ConfigError([f"mode {mode!r}: choose one of {', '.join(MODES)}"], source)
    data = dict(data)
    refuse_other_families(data, source)
    detected, note = detect_mode(data)
    chosen = mode or detected
    if chosen is None:
        raise ConfigError(["cannot tell whether this is a LoRA, DreamBooth or textual-inversion "
                           "config (none of its tab's keys, e.g. LoRA_type, is there): give "
                           "the mode (--mode lora)"], source)
    report = ImportReport(source, chosen)
    if note and chosen == detected:
        report.notes.append(note)
    if detected and chosen != detected:
        report.notes.append(f"the file looks like a {detected} config; imported as {chosen}")
    ctx = Ctx(data, chosen, report, set(config_io.all_paths()), _defaults())
    derived_keys = {k for keys, _ in DERIVED for k in keys}
    for key in data:
        if key not in derived_keys:
            _one_key(ctx, key)
    for keys, handler in DERIVED:
        if any(k in data for k in keys):
            try:
                handler(ctx)
            except ValueError as exc:  # a value no converter could read
                ctx.problems.append(f"{', '.join(k for k in keys if k in data)}: {exc}")
                continue
            _check_accounted(ctx, keys, handler)
    if ctx.problems:
        raise ConfigError(list(dict.fromkeys(ctx.problems)), source)
    try:
        cfg = config_io.from_dict(ctx.out, source)
    except ConfigError as exc:
        raise ConfigError([_explain(p, ctx.targets) for p in exc.problems], source) from None
    return cfg, report


def import_kohya_file(path: str | Path, mode: str | None = None
                      ) -> tuple[TrainConfig, ImportReport]:
    return import_kohya(read_json(path), mode, str(path))


def _defaults() -> dict[str, Any]:
    """Every dotted key's default value."""
    full = TrainConfig().model_dump(mode="python")
    return {f"{section}.{name}": value for section, values in full.items()
            if isinstance(values, dict) for name, value in values.items()}


def _one_key(ctx: Ctx, key: str) -> None:
    if key in DIRECT:
        ctx.apply(key, DIRECT[key])
    elif key in NOT_NEEDED:
        ctx.skip(key, NOT_NEEDED[key])
    elif key in NOT_SUPPORTED:
        value = ctx.data[key]
        if is_off(value) or value in OFF_VALUES.get(key, ()):
            ctx.unset(key)
        else:
            ctx.refuse(key, NOT_SUPPORTED[key])
    elif key in FAMILY_SWITCHES or is_family_key(key):
        ctx.skip(key, FAMILY_REASON)
    else:
        ctx.report.unknown.append((key, ctx.data[key]))


def _check_accounted(ctx: Ctx, keys: tuple[str, ...], handler: Any) -> None:
    """A handler must record every key it owns: nothing is dropped silently."""
    missing = [k for k in keys if k in ctx.data and k not in ctx.report.keys()]
    if missing and not ctx.problems:
        raise AssertionError(f"{handler.__name__} left {missing} unaccounted")


def _explain(problem: str, targets: dict[str, str]) -> str:
    """A schema error names our dotted key; add the kohya key it came from."""
    match = re.match(r"([a-z_]+\.[a-z_0-9]+)", problem)
    if match and match.group(1) in targets:
        return f"{problem} (from the kohya_ss key {targets[match.group(1)]})"
    return problem
