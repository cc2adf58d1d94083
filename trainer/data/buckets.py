"""Aspect-ratio bucketing, as pure functions (after sd-scripts' ``BucketManager``).

Buckets are (width, height) pairs whose sides are multiples of ``step`` between ``min_side`` and
``max_side`` and whose area is at most ``resolution ** 2``. An image goes to the bucket whose
aspect ratio is nearest its own; it is resized, keeping its aspect ratio, until it covers the
bucket, then cropped to it (at the center, or at a random place). With ``no_upscale`` an image
smaller than the bucket area gets a bucket of its own size rounded down to ``step``, so it is
never enlarged. With bucketing off every image goes to ``resolution x resolution``.
A non-square base (``height``, from a dataset TOML's ``resolution = [w, h]``) sets the area
``w * h`` (sd-scripts' ``max_area``) and, with bucketing off, the one size ``w x h``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional

Size = tuple[int, int]  # (width, height)
Box = tuple[int, int, int, int]  # (left, top, right, bottom)


@dataclass(frozen=True)
class BucketSpec:
    resolution: int
    enabled: bool = True
    min_side: int = 256
    max_side: int = 1024
    step: int = 64
    no_upscale: bool = False
    height: Optional[int] = None  # a non-square base: resolution x height

    @classmethod
    def from_config(cls, ds: Any) -> BucketSpec:
        """From a ``DatasetSection`` (or anything with the same fields); a ``[w, h]``
        resolution is the non-square base ``w x h``."""
        res = ds.resolution
        width, height = (res, res) if isinstance(res, int) else (res[0], res[-1])
        return cls(
            resolution=width, height=height if height != width else None,
            enabled=ds.enable_bucket,
            min_side=ds.min_bucket_reso,
            max_side=ds.max_bucket_reso,
            step=ds.bucket_reso_steps,
            no_upscale=ds.bucket_no_upscale,
        )

    @property
    def base(self) -> Size:
        """The base size (width, height): every image's size with bucketing off."""
        return (self.resolution, self.height or self.resolution)

    @property
    def max_area(self) -> int:
        return self.base[0] * self.base[1]


def bucket_name(bucket: Size) -> str:
    return f"{bucket[0]}x{bucket[1]}"


def make_buckets(resolution: int, min_side: int, max_side: int, step: int) -> list[Size]:
    """All buckets of area <= resolution**2 with sides in [min_side, max_side], sorted.

    The square bucket (``resolution`` rounded down to ``step``) is always included.
    """
    area = resolution * resolution
    side = max(step, resolution - resolution % step)
    buckets = {(side, side)}
    width = -(-min_side // step) * step  # min_side rounded up to the step
    while width <= max_side:
        height = min(max_side, (area // width) // step * step)
        if height >= min_side:
            buckets.add((width, height))
            buckets.add((height, width))
        width += step
    return sorted(buckets)


def nearest_bucket(size: Size, buckets: list[Size]) -> Size:
    """The bucket whose aspect ratio is nearest the image's (log distance; ties: larger area)."""
    ratio = math.log(size[0] / size[1])
    return min(
        buckets, key=lambda b: (round(abs(math.log(b[0] / b[1]) - ratio), 9), -b[0] * b[1])
    )


def no_upscale_bucket(size: Size, max_area: int, max_side: int, step: int) -> Size:
    """A bucket that needs no upscaling: the image's size, shrunk to the area and the largest
    side when it exceeds them, then rounded down to ``step`` (at least ``step``)."""
    width, height = float(size[0]), float(size[1])
    if width * height > max_area:
        scale = math.sqrt(max_area / (width * height))
        width, height = width * scale, height * scale
    if max(width, height) > max_side:
        scale = max_side / max(width, height)
        width, height = width * scale, height * scale
    # the epsilon keeps 1023.9999 (float error of an exact 1024) from losing a whole step
    def down(side: float) -> int:
        return max(step, int(side + 1e-6) // step * step)

    return (down(width), down(height))


def assign_bucket(size: Size, spec: BucketSpec, buckets: Optional[list[Size]] = None) -> Size:
    """The bucket of an image of ``size`` under ``spec`` (``buckets``: a precomputed table)."""
    if not spec.enabled:
        return spec.base
    if spec.no_upscale and size[0] * size[1] <= spec.max_area:
        return no_upscale_bucket(size, spec.max_area, spec.max_side, spec.step)
    table = buckets if buckets is not None else bucket_table_for(spec)
    return nearest_bucket(size, table)


def bucket_table_for(spec: BucketSpec) -> list[Size]:
    return make_buckets(math.isqrt(spec.max_area), spec.min_side, spec.max_side, spec.step)


def cover_size(size: Size, bucket: Size) -> Size:
    """The size of the image resized, keeping its aspect ratio, just enough to cover ``bucket``."""
    scale = max(bucket[0] / size[0], bucket[1] / size[1])
    width = max(bucket[0], int(size[0] * scale + 0.5))
    height = max(bucket[1], int(size[1] * scale + 0.5))
    return (width, height)


def crop_box(resized: Size, bucket: Size, rng: Optional[random.Random] = None) -> Box:
    """The crop of a ``resized`` image to ``bucket``: centered, or random when ``rng`` is given."""
    spare_x, spare_y = resized[0] - bucket[0], resized[1] - bucket[1]
    if rng is None:
        left, top = spare_x // 2, spare_y // 2
    else:
        left, top = rng.randint(0, spare_x), rng.randint(0, spare_y)
    return (left, top, left + bucket[0], top + bucket[1])


def size_problem(size: Size, spec: BucketSpec) -> Optional[str]:
    """Why an image of ``size`` cannot be bucketed under ``spec``, or None when it can.

    With bucketing on and ``no_upscale`` off, an image smaller than ``min_bucket_reso`` on both
    sides would be enlarged a lot (as sd-scripts, we refuse it). With ``no_upscale`` on, a side
    shorter than one bucket step cannot form a bucket without enlarging. With bucketing off any
    size is resized to the square resolution.
    """
    width, height = size
    if not spec.enabled:
        return None
    if spec.no_upscale:
        if min(width, height) < spec.step:
            return (
                f"{width}x{height} has a side shorter than dataset.bucket_reso_steps "
                f"({spec.step}), so it cannot be bucketed without upscaling"
            )
        return None
    if width < spec.min_side and height < spec.min_side:
        return (
            f"{width}x{height} is smaller than dataset.min_bucket_reso ({spec.min_side}) on both "
            "sides; remove it, lower dataset.min_bucket_reso or set dataset.bucket_no_upscale"
        )
    return None
