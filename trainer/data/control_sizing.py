"""How a control image is sized for its target: with the target's bucket, or as the pipeline does.

``target`` (the default, musubi-tuner's too): the control covers the target's resized frame at
its own aspect, centered, and takes the target's crop box and flip, so a control of the
target's size is rendered exactly as the target is (same resize, same crop, same flip) and both
land in one bucket. ``area``: the family's pipeline resizes its references to about a pixel area
at their own aspect (``FamilySpec.controls.area``; a dataset TOML's ``control_resolution``),
sides on multiples of the family's ``multiple``, or to the one of the family's preferred sizes
(``FamilySpec.controls.sizes``) nearest their aspect; the control is centered in that size and
flipped with its target. ``native`` (the TOML's ``no_resize_control``; a family whose area is
a limit, ``ControlSpec.shrink_only``: FLUX.2's): the control keeps its size, cropped to the
multiple (and scaled down to the area when ``control_resolution`` is also set, or the family's
limit). A batch holds targets of one bucket whose controls have the same sizes
(trainer/data/dataset.py groups them so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Union

from .buckets import Box, Size, cover_size, crop_box

Mode = Literal["target", "area", "native"]


@dataclass(frozen=True)
class ControlSizing:
    mode: Mode = "target"
    area: Optional[int] = None  # pixels (area: required; native: the most)
    multiple: int = 16
    sizes: tuple[Size, ...] = ()  # area: the preferred (width, height), nearest aspect wins

    @classmethod
    def of_family(cls, controls: object) -> ControlSizing:
        """The sizing a family's ``ControlSpec`` declares (an area that is only a limit:
        ``native``, capped at it)."""
        area = getattr(controls, "area", None)
        if area and getattr(controls, "shrink_only", False):
            return cls("native", area, getattr(controls, "multiple", 16))
        return cls("area" if area else "target", area, getattr(controls, "multiple", 16),
                   tuple(getattr(controls, "sizes", ())) if area else ())

    def with_toml(self, resolution: Union[int, list[int], None], no_resize: bool
                  ) -> ControlSizing:
        """musubi-tuner's ``control_resolution`` (a side or [width, height]) and
        ``no_resize_control`` over this sizing."""
        sides = [resolution] if isinstance(resolution, int) else resolution or []
        area = sides[0] * sides[-1] if sides else None
        if no_resize:
            return ControlSizing("native", area, self.multiple)
        if area:
            return ControlSizing("area", area, self.multiple)
        return self


def _round(side: float, multiple: int) -> int:
    return max(multiple, int(side / multiple) * multiple)


def own_size(size: Size, sizing: ControlSizing) -> Size:
    """The size a control of ``size`` is trained at, for the ``area`` and ``native`` modes."""
    width, height = size
    if sizing.mode == "area" and sizing.sizes:  # BFL's rule: nearest aspect, then the smaller
        aspect = width / height
        _, width, height = min((abs(aspect - w / h), w, h) for w, h in sizing.sizes)
    elif sizing.area and (sizing.mode == "area" or width * height > sizing.area):
        scale = math.sqrt(sizing.area / (width * height))
        width, height = width * scale, height * scale
    return (_round(width, sizing.multiple), _round(height, sizing.multiple))


def control_geometry(size: Size, sizing: ControlSizing, bucket: Size, target: tuple[Size, Box]
                     ) -> tuple[Size, Size, Box]:
    """(the control's trained size, its resize, its crop box) for a control of ``size`` whose
    target has the bucket ``bucket`` and the geometry ``target`` (its resize and crop)."""
    if sizing.mode == "target":
        resized, box = target
        if size == resized or size[0] * resized[1] == size[1] * resized[0]:
            covered = resized  # the target's aspect: exactly the target's resize and crop
        else:
            covered = cover_size(size, resized)
        dx, dy = (covered[0] - resized[0]) // 2, (covered[1] - resized[1]) // 2
        return bucket, covered, (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)
    out = own_size(size, sizing)
    covered = cover_size(size, out)
    return out, covered, crop_box(covered, out)
