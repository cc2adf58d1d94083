"""Loss masks (``training.masked_loss``): which pixels of an image the loss looks at.

A mask comes from the image's own alpha channel (``dataset.alpha_mask``; an image without one
trains everywhere, as in sd-scripts) or from a grayscale image of the same file stem in
``dataset.mask_data_dir`` (white = train, black = ignore), either directly in that folder or in
a subfolder named like the image's concept folder (``10_cat/img.png`` -> ``masks/10_cat/img.png``
first, then ``masks/img.png``). The mask is rendered with its image's resize, crop and flip, then
averaged down to the latent size (8 x 8 pixels per latent pixel), as sd-scripts' masked loss
resizes it with area interpolation. Regularization images have no mask: they train everywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from .buckets import Box, Size
from .images import IMAGE_EXTENSIONS, load_image, render

LATENT_FACTOR = 8  # pixels per latent pixel along each side (the VAE's downscale)


@dataclass(frozen=True)
class MaskSource:
    """Where an image's mask comes from; ``key`` goes into the latent cache key."""

    kind: Literal["alpha", "file"]
    path: Path  # the image itself (alpha) or the mask file
    key: str


def mask_file_for(image: Path, concept_folder: str, mask_dir: Path) -> Optional[Path]:
    """The mask file of ``image`` in ``mask_dir`` (concept subfolder first), or None."""
    for folder in (mask_dir / concept_folder, mask_dir):
        for ext in IMAGE_EXTENSIONS:
            candidate = folder / f"{image.stem}{ext}"
            if candidate.is_file():
                return candidate
    return None


def find_masks(cfg: Any, entries: list[Any], problems: list[str]) -> Optional[list]:
    """One :class:`MaskSource` (None for regularization images) per entry, or None when
    ``training.masked_loss`` is off. Missing masks are added to ``problems``."""
    ds = cfg.dataset
    if not cfg.training.masked_loss:
        return None
    if ds.alpha_mask:
        return [None if e.is_reg else MaskSource("alpha", e.path, "alpha") for e in entries]
    mask_dir = Path(ds.mask_data_dir).expanduser()
    if not mask_dir.is_dir():
        problems.append(f"dataset.mask_data_dir: folder {mask_dir} does not exist")
        return None
    sources: list[Optional[MaskSource]] = []
    missing = []
    for entry in entries:
        found = None if entry.is_reg else mask_file_for(entry.path, entry.folder.path.name,
                                                        mask_dir)
        if found is None and not entry.is_reg:
            missing.append(entry.path)
        sources.append(found and MaskSource(
            "file", found, "file:" + hashlib.sha256(found.read_bytes()).hexdigest()))
    if missing:
        shown = ", ".join(str(p) for p in missing[:5]) + (" ..." if len(missing) > 5 else "")
        problems.append(
            f"dataset.mask_data_dir: no mask in {mask_dir} for {len(missing)} image(s): {shown}; "
            f"add a grayscale image of the same name (white = train) for each, in {mask_dir} "
            f"or in a subfolder named like the image's folder")
    return sources


def load_mask(source: MaskSource, size: Size) -> Image.Image:
    """The mask as an 8-bit grayscale image ("L"); an image without alpha gets an all-white
    mask of ``size`` (w, h)."""
    if source.kind == "alpha":
        alpha = load_image(source.path).alpha
        return alpha if alpha is not None else Image.new("L", size, 255)
    try:
        with Image.open(source.path) as img:
            img.load()
            oriented = ImageOps.exif_transpose(img)
            return (oriented if oriented is not None else img).convert("L")
    except Exception as exc:  # PIL raises many kinds of errors on corrupt data
        raise ValueError(f"mask {source.path}: cannot read it as an image ({exc})") from None


def downscale(mask: torch.Tensor) -> torch.Tensor:
    """[..., H, W] in 0..1 -> [..., H/8, W/8], each latent pixel the mean of its 8x8 pixels."""
    h, w = mask.shape[-2:]
    flat = mask.reshape(-1, 1, h, w)
    out = F.interpolate(flat, size=(h // LATENT_FACTOR, w // LATENT_FACTOR), mode="area")
    return out.reshape(*mask.shape[:-2], *out.shape[-2:])


def render_mask(source: MaskSource, resized: Size, box: Box, flip: bool = False) -> torch.Tensor:
    """The mask of one training image at latent size: [1, h, w] in 0..1, rendered with the
    image's resize ``resized``, crop ``box`` and ``flip`` (trainer/data/images.py ``render``)."""
    rendered = render(load_mask(source, resized), resized, box, flip)
    pixels = torch.from_numpy(np.asarray(rendered, dtype=np.float32) / 255.0)
    return downscale(pixels[None])


def full_mask(bucket: Size) -> torch.Tensor:
    """The mask of an image that trains everywhere (a regularization image): ones."""
    return torch.ones(1, bucket[1] // LATENT_FACTOR, bucket[0] // LATENT_FACTOR)
