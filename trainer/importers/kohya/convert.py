"""Value converters for kohya_ss GUI JSON configs: small pure functions.

kohya_ss (github.com/bmaltais/kohya_ss) saves its form as JSON with the types its widgets
happened to give: numbers as strings (``"0.0001"``, ``"1234"``), ``""`` for unset, ``0`` for off,
``max_resolution`` as ``"W,H"`` text, optimizer arguments as ``key=value`` text and extra
sd-scripts flags as one command-line string. Each converter takes the raw value and returns the
value for our schema, :data:`UNSET` when kohya's value means "not set" (the schema's default then
stands), or raises ``ValueError`` with a reason.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

UNSET: Any = object()  # "kohya's value means not set": leave our default


def is_empty(value: Any) -> bool:
    """``None``, ``""`` or whitespace: kohya_ss's "not filled in"."""
    return value is None or (isinstance(value, str) and not value.strip())


def number(value: Any) -> Optional[float]:
    """A number kohya may have stored as a string; None when empty."""
    if is_empty(value):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number") from None
    if not math.isfinite(out):
        raise ValueError(f"{value!r} is not a finite number")
    return out


def to_float(value: Any) -> Any:
    out = number(value)
    return UNSET if out is None else out


def to_int(value: Any) -> Any:
    out = number(value)
    if out is None:
        return UNSET
    if out != int(out):
        raise ValueError(f"{value!r} is not a whole number")
    return int(out)


def nonzero(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """kohya's "0 means off" (sd-scripts gets no flag): 0 -> unset, else ``conv``."""
    def convert(value: Any) -> Any:
        out = conv(value)
        return UNSET if out is not UNSET and out == 0 else out
    convert.__name__ = f"nonzero_{conv.__name__}"
    return convert


def to_bool(value: Any) -> Any:
    if is_empty(value):
        return UNSET
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{value!r} is not true or false")


def only_on(value: Any) -> Any:
    """A switch kohya_ss passes only when on (a cache switch): off leaves our default."""
    return True if to_bool(value) is True else UNSET


def to_text(value: Any) -> Any:
    return UNSET if is_empty(value) else str(value).strip()


def choice(mapping: dict[str, Any]) -> Callable[[Any], Any]:
    """A kohya choice -> ours (``UNSET`` entries mean our default)."""
    def convert(value: Any) -> Any:
        if is_empty(value):
            return UNSET
        if value not in mapping:
            raise ValueError(f"{value!r} is not one of {', '.join(map(repr, mapping))}")
        return mapping[value]
    return convert


def prompt_lines(value: Any) -> Any:
    """kohya's sample prompts text (one prompt per line; '#' lines are comments) -> a list."""
    if is_empty(value):
        return UNSET
    lines = [ln.strip() for ln in str(value).splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")] or UNSET


def resolution(value: Any) -> tuple[int | list[int], Optional[str]]:
    """``"W,H"`` (or ``"S"``) -> (``dataset.resolution``: the side or [W, H], a note when a
    side is rounded).

    sd-scripts reads ``--resolution W,H`` as the base W x H: bucketing keeps each bucket's
    area at or under W * H (train_util.BucketManager, max_area), and without buckets every
    image is W x H; ``dataset.resolution = [W, H]`` is the same base here. A side that is not a
    multiple of 8 (the VAE's factor) goes down to one, so no bucket grows past W x H."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"{value!r} is not W,H")
    sides = [int(number(p) or 0) for p in parts]
    if min(sides) <= 0:
        raise ValueError(f"{value!r}: sides must be positive")
    rounded = [max(8, s // 8 * 8) for s in sides]
    note = None if rounded == sides else (
        f"{'x'.join(map(str, sides))} trains at {'x'.join(map(str, rounded))}: each side down "
        f"to a multiple of 8 (the VAE's factor)")
    if len(rounded) == 1 or rounded[0] == rounded[1]:
        return rounded[0], note
    return rounded, note


def literal(text: str) -> Any:
    """An argument value as sd-scripts reads it (``ast.literal_eval``, else the text);
    tuples become lists, e.g. ``betas=0.9,0.99`` -> [0.9, 0.99]."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return list(value) if isinstance(value, tuple) else value


def key_values(text: Any) -> dict[str, Any]:
    """``optimizer_args`` text: ``"d_coef=2" "betas=0.9,0.99" decouple=True`` -> a dict."""
    if is_empty(text):
        return {}
    out: dict[str, Any] = {}
    items = shlex.split(str(text))
    if items and re.fullmatch(r"--\w+_args", items[0]):  # pasted with its flag in front
        items = items[1:]
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out[key.strip()] = literal(raw.strip())
    return out


def key_values_or_unset(text: Any) -> Any:
    return key_values(text) or UNSET


def flags(text: Any) -> list[tuple[str, Any]]:
    """``additional_parameters``: ``--max_grad_norm=0 --flag --key "a b"`` -> [(name, value)];
    a flag without a value gets True. Raises ValueError on text that is not flags."""
    if is_empty(text):
        return []
    try:
        words = shlex.split(str(text))
    except ValueError as exc:
        raise ValueError(f"cannot split {text!r}: {exc}") from None
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ValueError(f"{word!r} is not a --flag")
        name, sep, value = word[2:].partition("=")
        if not sep:
            values = []
            while i + 1 < len(words) and not words[i + 1].startswith("--"):
                i += 1
                values.append(words[i])
            value = " ".join(values) if values else True
        out.append((name, value))
        i += 1
    return out


def percent_of(percent: float, total: int) -> int:
    """sd-scripts turns a fractional warm-up into ``int(fraction * total)`` steps
    (train_util.get_scheduler_fix); kohya_ss passes ``percent / 100`` as that fraction."""
    return int(percent / 100 * total)


def kohya_image_count(train_data_dir: str, reg_data_dir: Optional[str],
                      dataset_repeats: Optional[int] = None) -> Optional[int]:
    """Images x repeats of a kohya folder (with ``dataset_repeats``, its own images that many
    times too: the finetune layout), doubled with regularization images (they interleave, as
    kohya_ss's own step estimate assumes); None when the folder cannot be read."""
    from trainer.data.discover import find_concept_folders
    from trainer.data.images import is_image_file

    root = Path(train_data_dir).expanduser()
    if not root.is_dir():
        return None
    count = 0
    for folder in find_concept_folders(root, "dataset.train_data_dir", lambda _msg: None,
                                       dataset_repeats):
        count += folder.repeats * sum(1 for p in folder.path.iterdir() if is_image_file(p))
    return count * (2 if reg_data_dir else 1) or None
