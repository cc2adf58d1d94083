"""``dataset.resolution``: one side (a square base) or ``[width, height]``, as sd-scripts'
``--resolution W,H`` and its dataset TOML's ``resolution = [w, h]`` take it. The bucket code
reads the pair as the base size and ``w * h`` as the largest bucket area
(trainer/data/buckets.py); the helpers here give the readers of the setting one shape each."""

from __future__ import annotations

import math
import re
from typing import Any, Union

from pydantic_core import PydanticCustomError

MIN_SIDE, MAX_SIDE, SIDE_STEP = 64, 4096, 8
Resolution = Union[int, list[int]]


def _side(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError(
            "int_type", "Input should be a valid integer or [width, height], e.g. 512 or "
            "[512, 768]")
    for ok, kind, ctx in ((value >= MIN_SIDE, "greater_than_equal", {"ge": MIN_SIDE}),
                          (value <= MAX_SIDE, "less_than_equal", {"le": MAX_SIDE}),
                          (value % SIDE_STEP == 0, "multiple_of", {"multiple_of": SIDE_STEP})):
        if not ok:
            raise PydanticCustomError(kind, "each side out of range", ctx)
    return value


def check_resolution(value: Any) -> Resolution:
    """The schema's check (a ``mode="before"`` validator): an int, ``[w, h]`` or the text
    ``"W,H"`` / ``"WxH"`` (kohya_ss's ``max_resolution``); each side 64-4096 on multiples of
    8. Returns an int or a list of two ints."""
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*([,x]\s*\d+\s*)?", value):
        value = [int(s) for s in re.split(r"[,x]", value)]
        value = value[0] if len(value) == 1 else value
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise PydanticCustomError("resolution_pair",
                                      "must be one side or [width, height]")
        return [_side(v) for v in value]
    return _side(value)


def base_size(value: Resolution) -> tuple[int, int]:
    """(width, height) of the base."""
    return (value, value) if isinstance(value, int) else (value[0], value[1])


def area_side(value: Resolution) -> int:
    """The side of the square of the same area (what memory and time scale with)."""
    width, height = base_size(value)
    return math.isqrt(width * height)


def long_side(value: Resolution) -> int:
    return max(base_size(value))


def as_text(value: Resolution) -> str:
    """``512`` or ``512x768``: for logs and advice."""
    width, height = base_size(value)
    return str(width) if width == height else f"{width}x{height}"


def scaled(value: Resolution, factor: float, step: int = 64, floor: int = 256) -> Resolution:
    """Each side times ``factor``, down to ``step``, at least ``floor``; the same form."""
    sides = [max(floor, int(s * factor) // step * step) for s in base_size(value)]
    return sides[0] if isinstance(value, int) else sides
