"""The ``ss_*`` / ``modelspec.*`` / ``sshs_*`` metadata of a LoRA file, for people.

sd-scripts writes every value as a string: numbers with ``str()``, unset values as ``"None"``,
times as seconds since the epoch, and the dataset facts as JSON (``ss_tag_frequency``:
``{folder: {tag: count}}``; ``ss_dataset_dirs``: ``{folder: {"n_repeats", "img_count"}}``).
These functions turn the ones a user asks about into labelled lines; unknown keys stay in the
raw metadata.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable
from typing import Any, Optional

UNSET = ("", "None", "null")
SHOWN = 300  # characters of one value in the report; longer ones end in "..."
JSON_LIMIT = 32 * 2**20  # a JSON-valued key longer than this is not parsed
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")


def shown(value: Any, limit: int = SHOWN) -> str:
    """A value from a file as one line of plain text: at most ``limit`` characters ("..." marks
    a cut), control characters (terminal escapes too) and invalid Unicode replaced."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    text = text.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("\ufffd", text.replace("\n", " ").replace("\t", " "))


def _get(meta: dict[str, str], key: str) -> Optional[str]:
    value = meta.get(key)
    return None if value is None or value.strip() in UNSET else value.strip()


def _time(value: str) -> str:
    try:
        stamp = datetime.datetime.fromtimestamp(float(value))
    except (ValueError, OverflowError, OSError):
        return value
    return stamp.replace(microsecond=0).isoformat(sep=" ")


def _json(value: str) -> Any:
    if len(value) > JSON_LIMIT:
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python recurses
        return None


def _of(meta: dict[str, str], key: str, total_key: str) -> Optional[str]:
    value, total = _get(meta, key), _get(meta, total_key)
    if value is None:
        return None
    return value if total in (None, "0") else f"{value} of {total}"


def _duration(meta: dict[str, str]) -> Optional[str]:
    try:
        seconds = float(meta["ss_training_finished_at"]) - float(meta["ss_training_started_at"])
    except (KeyError, ValueError):
        return None
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _datasets(meta: dict[str, str]) -> Optional[str]:
    dirs = _json(meta.get("ss_dataset_dirs", ""))
    if not isinstance(dirs, dict) or not dirs:
        return None
    parts = []
    for name, info in dirs.items():
        if isinstance(info, dict):
            parts.append(f"{name} ({info.get('img_count', '?')} images x "
                         f"{info.get('n_repeats', '?')} repeats)")
    return ", ".join(parts) or None


def _hashes(meta: dict[str, str], keys: tuple[str, ...]) -> Optional[str]:
    found = [f"{_get(meta, k)[:12]} ({k})" for k in keys if _get(meta, k)]
    return ", ".join(found) or None


FACTS: list[tuple[str, Callable[[dict[str, str]], Optional[str]]]] = [
    ("Title", lambda m: _get(m, "modelspec.title") or _get(m, "ss_output_name")),
    ("Trigger", lambda m: _get(m, "modelspec.trigger_phrase") or _get(m, "ti_token_string")),
    ("Base model", lambda m: _get(m, "ss_sd_model_name")),
    ("Base model hash", lambda m: _hashes(m, ("ss_new_sd_model_hash", "ss_sd_model_hash",
                                              "ti_base_model_hash"))),
    ("Base model version", lambda m: _get(m, "ss_base_model_version")),
    ("Architecture", lambda m: _get(m, "modelspec.architecture")),
    ("Training steps", lambda m: _of(m, "ss_steps", "ss_max_train_steps")),
    ("Epochs", lambda m: _of(m, "ss_epoch", "ss_num_epochs")),
    ("Training images", lambda m: _get(m, "ss_num_train_images")),
    ("Regularization images", lambda m: _get(m, "ss_num_reg_images")),
    ("Datasets", _datasets),
    ("Batch size", lambda m: _get(m, "ss_total_batch_size")),
    ("Resolution", lambda m: _get(m, "ss_resolution") or _get(m, "modelspec.resolution")),
    ("Learning rate", lambda m: _get(m, "ss_learning_rate")),
    ("UNet / text encoder LR", lambda m: (f"{_get(m, 'ss_unet_lr')} / "
                                          f"{_get(m, 'ss_text_encoder_lr')}")
     if _get(m, "ss_unet_lr") or _get(m, "ss_text_encoder_lr") else None),
    ("Optimizer", lambda m: _get(m, "ss_optimizer")),
    ("LR scheduler", lambda m: _get(m, "ss_lr_scheduler")),
    ("Network", lambda m: " ".join(x for x in (
        _get(m, "ss_network_module"),
        f"dim {_get(m, 'ss_network_dim')}" if _get(m, "ss_network_dim") else None,
        f"alpha {_get(m, 'ss_network_alpha')}" if _get(m, "ss_network_alpha") else None,
        _get(m, "ss_network_args") if _get(m, "ss_network_args") not in (None, "{}") else None,
    ) if x) or None),
    ("Mixed precision", lambda m: _get(m, "ss_mixed_precision")),
    ("Seed", lambda m: _get(m, "ss_seed")),
    ("Prediction type", lambda m: _get(m, "modelspec.prediction_type")),
    ("Started", lambda m: _time(m["ss_training_started_at"]) if _get(
        m, "ss_training_started_at") else None),
    ("Duration", _duration),
    ("Date", lambda m: _get(m, "modelspec.date")),
    ("Merged from", lambda m: _get(m, "modelspec.merged_from")),
    ("Comment", lambda m: _get(m, "ss_training_comment")),
    ("File hash", lambda m: _hashes(m, ("sshs_model_hash", "sshs_legacy_hash"))),
]


def training_facts(meta: dict[str, str]) -> list[tuple[str, str]]:
    """(label, value) of the facts the metadata holds, in a fixed order."""
    out = []
    for label, read in FACTS:
        value = read(meta)
        if value:
            out.append((label, value))
    return out


def training_tags(meta: dict[str, str]) -> list[tuple[str, int]]:
    """The tags of ``ss_tag_frequency`` summed over the folders, most frequent first."""
    folders = _json(meta.get("ss_tag_frequency", ""))
    counts: dict[str, int] = {}
    if isinstance(folders, dict):
        for tags in folders.values():
            if isinstance(tags, dict):
                for tag, n in tags.items():
                    if isinstance(n, (int, float)):
                        counts[tag] = counts.get(tag, 0) + int(n)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))
