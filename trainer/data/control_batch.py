"""Edit training's controls in the batches: their buckets, pixels and cache jobs.

A dataset without controls is bucketed by its targets alone (the keys stay the bucket sizes, so
its epochs are exactly as before). With controls, a batch holds targets of one bucket that have
the same number of controls of the same sizes, so that each reference index stacks into one
tensor: the group key is ``(bucket, (size of control 0, size of control 1, ...))``.

Where the family's text encoder reads the controls too (``ControlSpec.text``: Qwen-Image-Edit),
a row's text-encoder outputs depend on its controls as rendered; the text cache then keys each
row by its caption and its controls (their files' hashes, sizes, crop and flip), as musubi-tuner
caches them per item with its control images, and encodes each key alone with its controls.
A per-step change of the controls (a random crop with the target, a colour draw) rules that
cache out; each step then encodes its captions with its controls' pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch

from . import color_aug
from .buckets import Box, Size
from .cache import ControlJob
from .control_sizing import ControlSizing, control_geometry
from .controls import ControlSet, count_problems
from .errors import DatasetError
from .images import load_image, render, to_tensor
from .sampler import group_by_bucket

Geometry = tuple[Size, Box]


def sizings(controls: list[Optional[ControlSet]], entries: list[Any], family_controls: Any,
            resolution: Optional[int] = None) -> list[ControlSizing]:
    """Each entry's control sizing: the family's (or ``dataset.control_resolution``'s area,
    ``resolution``), or its dataset TOML subset's (``control_resolution``,
    ``no_resize_control``)."""
    base = ControlSizing.of_family(family_controls)
    if resolution is not None:
        base = base.with_toml(resolution, False)
    out = []
    for entry in entries:
        opts = entry.folder.options
        out.append(base.with_toml(opts.control_resolution, opts.no_resize_control)
                   if opts is not None else base)
    return out


def geometries(found: Optional[ControlSet], sizing: ControlSizing, bucket: Size,
               target: Geometry) -> list[tuple[Size, Size, Box]]:
    """(trained size, resize, crop box) of each control of one target."""
    if found is None:
        return []
    return [control_geometry(c.size, sizing, bucket, target) for c in found.images]


def group_key(bucket: Size, found: Optional[ControlSet], sizing: ControlSizing,
              target: Geometry) -> tuple:
    """The batch group of a target with controls (see the module's docstring)."""
    return (bucket, tuple(size for size, _, _ in geometries(found, sizing, bucket, target)))


def jobs(found: Optional[ControlSet], sizing: ControlSizing, bucket: Size, target: Geometry
         ) -> tuple[ControlJob, ...]:
    """The latent cache's jobs of one target's controls."""
    if found is None:
        return ()
    return tuple(ControlJob(c.path, c.content_hash, size, resized, box) for c, (size, resized, box)
                 in zip(found.images, geometries(found, sizing, bucket, target)))


def pixels(found: Optional[ControlSet], sizing: ControlSizing, bucket: Size, target: Geometry,
           flip: bool, color: color_aug.Draw = None) -> list[torch.Tensor]:
    """One target's controls as pixels [3, H, W] in [-1, 1], rendered with its flip (and its
    crop, when they share its bucket) and its colour draw."""
    if found is None:
        return []
    return [to_tensor(color_aug.apply(render(load_image(c.path).rgb, resized, box, flip), color))
            for c, (_, resized, box) in zip(found.images,
                                            geometries(found, sizing, bucket, target))]


def stack(per_row: list[list[torch.Tensor]]) -> Optional[list[torch.Tensor]]:
    """Rows' controls -> one tensor per reference index [B, ...]; None when they have none
    (every row of a batch has the same count: group_key)."""
    if not per_row or not per_row[0]:
        return None
    return [torch.stack([row[i] for row in per_row]) for i in range(len(per_row[0]))]


class WithControls:
    """TrainingData's edit-training part: its entries' controls, their sizing and batches."""

    entries: list[Any]
    buckets: list[Size]
    counts: list[int]
    controls: Optional[list[Optional[ControlSet]]]
    control_resolution: Optional[int] = None  # dataset.control_resolution
    held_out_controls: Optional[list[Optional[ControlSet]]] = None  # for the validation images
    _sizings: list[ControlSizing]
    _latents: Any
    _groups: dict
    text_cache_blocker: Optional[str]
    _control_text: bool = False
    _text: Any

    def _color_aug(self, index: int) -> bool:
        raise NotImplementedError  # TrainingData's

    def _random_crop(self, index: int) -> bool:
        raise NotImplementedError

    def _flip_aug(self, index: int) -> bool:
        raise NotImplementedError

    def _geometry(self, index: int, rng: Any) -> Geometry:
        raise NotImplementedError  # TrainingData's: the target's resize and crop

    def use_controls(self, controls: Optional[list[Optional[ControlSet]]],
                     family: Optional[str], resolution: Optional[int] = None) -> None:
        """Train each entry with its control images (trainer/data/controls.py), sized as
        ``family`` declares (its ``FamilySpec.controls``; None: not known yet, each control with
        its target's bucket), or at ``resolution`` (``dataset.control_resolution``; once given,
        kept when the run calls again with the loaded model's family). Raises DatasetError
        when the family cannot train them."""
        from trainer.families import spec

        if resolution is not None:
            self.control_resolution = resolution
        if not controls:
            return
        if family is not None:
            problems = count_problems(controls, self.entries, family)
            if problems:
                raise DatasetError(problems)
        self.controls = controls
        self._sizings = sizings(controls, self.entries,
                                spec(family).controls if family else None,
                                self.control_resolution)
        # a family whose text encoder reads the controls: the text cache keys rows by them
        self._control_text = bool(family) and spec(family).controls.text
        if self._control_text:
            self._block_text_cache(controls, spec(family).label)
        keys = [group_key(b, c, z, self._geometry(i, None)) for i, (b, c, z)
                in enumerate(zip(self.buckets, controls, self._sizings))]
        self._groups = group_by_bucket(self.counts, keys)

    def _block_text_cache(self, controls: list[Optional[ControlSet]], label: str) -> None:
        """Why the text outputs of these controls cannot be cached: they change per step."""
        changing = [(i, z) for i, (c, z) in enumerate(zip(controls, self._sizings)) if c]
        why = []
        if any(self._color_aug(i) for i, _ in changing):
            why.append("dataset.color_aug is on")
        if any(self._random_crop(i) and z.mode == "target" for i, z in changing):
            why.append("dataset.random_crop is on")
        if why:
            reason = (f"{' and '.join(why)}, and {label}'s text encoder reads the control "
                      f"images, which then change each step")
            if reason not in (self.text_cache_blocker or ""):
                self.text_cache_blocker = "; ".join(filter(None, (self.text_cache_blocker,
                                                                  reason)))

    def _text_key(self, index: int, caption: str, flip: bool) -> str:
        """The text cache's key of a row: its caption, and where the family's text encoder
        reads the controls, what they are as rendered."""
        if not self._control_text or not self.controls or not self.controls[index]:
            return caption
        rendered = " ".join(f"{j.content_hash}:{j.size}:{j.resized}:{j.box}"
                            for j in self._control_jobs(index, self._geometry(index, None)))
        return f"{caption}\n\x00controls flip={int(flip)} {rendered}"

    def _text_jobs(self, captions: list[str], encode_text: Callable, batch_size: int
                   ) -> tuple[list[str], Callable, int]:
        """(the text cache's keys, its encode, its batch size): the captions themselves, or
        with controls in the text, each entry's key once per flip it can take, encoded alone
        with its controls' pixels (``encode_text(captions, controls=...)``)."""
        if not self._control_text or not self.controls:
            return captions, encode_text, batch_size
        rows: dict[str, tuple[int, str, bool]] = {}
        for i, caption in enumerate(captions):
            for flip in ((False, True) if self._flip_aug(i) else (False,)):
                rows[self._text_key(i, caption, flip)] = (i, caption, flip)

        def encode(keys: list[str]) -> Any:
            [(i, caption, flip)] = [rows[k] for k in keys]
            found = self.controls[i]
            px = pixels(found, self._sizings[i], self.buckets[i], self._geometry(i, None), flip)
            if not px:
                return encode_text([caption])
            return encode_text([caption], controls=[p.unsqueeze(0) for p in px])

        return list(rows), encode, 1

    def _control_jobs(self, index: int, geometry: Geometry) -> tuple:
        if not self.controls:
            return ()
        return jobs(self.controls[index], self._sizings[index], self.buckets[index], geometry)

    def _add_controls(self, batch: Any, indices: list[int], flips: list[bool],
                      geometry: list[Geometry], colors: list) -> None:
        """The rows' controls, with each row's flip and crop (and colour draw)."""
        if self._latents is not None:
            batch.controls = stack(
                [self._latents.get_controls(i, f) for i, f in zip(indices, flips)])
            if not self._control_text or self._text is not None:
                return  # the text encoder reads them only when its outputs are not cached
        batch.control_pixels = stack([pixels(
            self.controls[i], self._sizings[i], self.buckets[i], g, f, c)
            for i, f, g, c in zip(indices, flips, geometry, colors)])
