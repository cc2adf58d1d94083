"""Reading training images: decode, validate, orient, convert to RGB, and render to a bucket.

Every image is opened the same way: the EXIF orientation is applied
(:func:`PIL.ImageOps.exif_transpose`), transparency is composited on white (the alpha channel is
kept beside the RGB image for masked losses), and grayscale, CMYK, 16-bit and palette images
become 8-bit RGB.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")

# EXIF orientations 5..8 turn the image by 90 degrees: width and height swap.
_SWAPPING_ORIENTATIONS = {5, 6, 7, 8}
_EXIF_ORIENTATION = 0x0112
_INTEGER_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N"}


@dataclass(frozen=True)
class LoadedImage:
    """An image ready for training: 8-bit RGB, and its alpha channel ("L") when it had one."""

    rgb: Image.Image
    alpha: Optional[Image.Image]


@dataclass(frozen=True)
class ImageInfo:
    """What validation learns about an image file: its displayed size and a hash of its bytes."""

    size: tuple[int, int]
    content_hash: str


def is_image_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(
        "."
    )


def inspect_image(path: Path) -> ImageInfo:
    """Fully decode an image once and return its oriented size and content hash.

    Raises ``ValueError`` with a one-line reason for an empty, unreadable or truncated file.
    """
    data = path.read_bytes()
    if not data:
        raise ValueError("empty file (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            width, height = img.size
            orientation = img.getexif().get(_EXIF_ORIENTATION, 1)
    except UnidentifiedImageError:
        raise ValueError("not a readable image (corrupt or not an image format)") from None
    except OSError as exc:
        if "truncated" in str(exc).lower():
            raise ValueError(f"truncated image ({exc})") from None
        raise ValueError(f"cannot decode image ({exc})") from None
    except Exception as exc:  # PIL raises many kinds of errors on corrupt data
        raise ValueError(f"cannot decode image ({type(exc).__name__}: {exc})") from None
    if orientation in _SWAPPING_ORIENTATIONS:
        width, height = height, width
    return ImageInfo((width, height), hashlib.sha256(data).hexdigest())


def _integer_to_rgb(img: Image.Image) -> Image.Image:
    """16-bit (and 32-bit integer) grayscale to 8-bit RGB, scaling 0..65535 to 0..255."""
    values = np.asarray(img, dtype=np.float64)
    gray = np.clip(np.round(values / 257.0), 0, 255).astype(np.uint8)
    return Image.fromarray(gray, mode="L").convert("RGB")


def _float_to_rgb(img: Image.Image) -> Image.Image:
    """32-bit float grayscale to RGB: values in 0..1 are scaled, anything else is clipped."""
    values = np.asarray(img, dtype=np.float64)
    if values.size and values.max() <= 1.0:
        values = values * 255.0
    gray = np.clip(np.round(values), 0, 255).astype(np.uint8)
    return Image.fromarray(gray, mode="L").convert("RGB")


def to_rgb(img: Image.Image) -> LoadedImage:
    """Convert any PIL mode to RGB; transparency is composited on white and returned as alpha."""
    if img.mode in _INTEGER_MODES:
        return LoadedImage(_integer_to_rgb(img), None)
    if img.mode == "F":
        return LoadedImage(_float_to_rgb(img), None)
    has_alpha = img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
        img.mode in ("P", "L", "RGB") and "transparency" in img.info
    )
    if not has_alpha:
        return LoadedImage(img.convert("RGB"), None)
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(white, rgba).convert("RGB")
    return LoadedImage(rgb, rgba.getchannel("A"))


def load_image(path: Path) -> LoadedImage:
    """Open an image for training: EXIF orientation applied, RGB, alpha kept aside."""
    with Image.open(path) as img:
        img.load()
        oriented = ImageOps.exif_transpose(img)
        return to_rgb(oriented if oriented is not None else img)


def render(
    img: Image.Image,
    resized: tuple[int, int],
    box: tuple[int, int, int, int],
    flip: bool = False,
) -> Image.Image:
    """Resize ``img`` to ``resized`` (w, h), crop ``box`` (left, top, right, bottom), maybe flip."""
    out = img if img.size == resized else img.resize(resized, Image.Resampling.LANCZOS)
    out = out.crop(box)
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out


def to_tensor(img: Image.Image) -> torch.Tensor:
    """An RGB image as a float tensor [3, H, W] in [-1, 1]."""
    array = np.asarray(img.convert("RGB"), dtype=np.float32)
    return torch.from_numpy(array.copy()).permute(2, 0, 1) / 127.5 - 1.0
