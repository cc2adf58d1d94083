"""sd-scripts' colour augmentation (``--color_aug``, train_util.AugHelper.color_aug): a third of
the images, drawn per sample, get either a hue shift of up to 8 OpenCV hue units (16 degrees)
or a gamma between 0.95 and 1.05 applied to the 0-255 values (``clip(x ** gamma, 0, 255)``, on
that scale as sd-scripts writes it). It changes the pixels at every step, so a latent cache
cannot hold it (sd-scripts asserts the two apart; the config refuses them together here).

The draw (:func:`draw`) comes from the batch's random generator, so a run repeats; the pixels
(:func:`apply`) are changed after the crop, before the tensor, as in sd-scripts."""

from __future__ import annotations

import random
from typing import Optional

import numpy as np
from PIL import Image

RATE = 0.33  # sd-scripts: random.random() <= 0.33
HUE_LIMIT = 8.0  # OpenCV hue units (0-180 is the circle): +-16 degrees
GAMMA = (0.95, 1.05)

Draw = Optional[tuple[str, float]]  # ("hue", units) or ("gamma", gamma); None: unchanged


def draw(rng: random.Random) -> Draw:
    """sd-scripts' three draws, in its order."""
    if rng.random() > RATE:
        return None
    if rng.random() > 0.5:
        return "hue", rng.uniform(-HUE_LIMIT, HUE_LIMIT)
    return "gamma", rng.uniform(*GAMMA)


def apply(img: Image.Image, change: Draw) -> Image.Image:
    if change is None:
        return img
    kind, amount = change
    rgb = np.asarray(img.convert("RGB"))
    if kind == "gamma":
        out = np.clip(rgb.astype(np.float64) ** amount, 0, 255).astype(np.uint8)
    else:
        out = shift_hue(rgb, amount * 2.0)
    return Image.fromarray(out, "RGB")


def shift_hue(rgb: np.ndarray, degrees: float) -> np.ndarray:
    """The hue of every pixel turned by ``degrees``, saturation and value kept (HSV)."""
    x = rgb.astype(np.float64) / 255.0
    value, low = x.max(axis=-1), x.min(axis=-1)
    chroma = value - low
    safe = np.where(chroma > 0, chroma, 1.0)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    hue = np.where(value == r, ((g - b) / safe) % 6,
                   np.where(value == g, (b - r) / safe + 2, (r - g) / safe + 4))
    hue = np.where(chroma > 0, (hue + degrees / 60.0) % 6, 0.0)
    # back from (hue, chroma, value): the standard piecewise HSV -> RGB
    k = lambda n: (n + hue) % 6  # noqa: E731
    channel = [value - chroma * np.clip(np.minimum(k(n), 4 - k(n)), 0, 1) for n in (5, 3, 1)]
    out = np.stack(channel, axis=-1) * 255.0
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
