"""The embedded sample dataset: a few generated pictures of colored shapes, in kohya layout.

``ensure_sample_dataset`` draws them from a fixed seed with PIL (no downloads), so the same
bytes come out every time; files that already hold those bytes are left alone. The images are
256 pixels on their short side (square, portrait and landscape), so they pass the default
``min_bucket_reso`` and train quickly once downscaled to a small resolution.

Edit training's controls of the same pictures (each shape's background alone: the edit adds
the shape) are written beside it, ``sample-dataset-control/10_shapes/<stem>.png``, outside the
dataset folder so that a run without ``dataset.control_dir`` sees no extra folder; the edit
presets set ``control_dir = "../sample-dataset-control"`` (read from train_data_dir).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from trainer.system.safe_write import atomic_path

from ..config import EMBEDDED_DATASET

SAMPLE_SEED = 1234
CONCEPT_FOLDER = "10_shapes"
COLORS = {
    "red": (220, 40, 40), "blue": (40, 70, 210), "green": (40, 170, 70),
    "yellow": (240, 210, 40), "white": (245, 245, 245), "purple": (130, 60, 170),
}
# (shape, color, background, width, height)
SHAPES = [
    ("circle", "red", "blue", 256, 256),
    ("square", "yellow", "green", 256, 384),
    ("triangle", "white", "purple", 384, 256),
    ("circle", "green", "yellow", 256, 384),
    ("square", "blue", "white", 384, 256),
    ("triangle", "red", "green", 256, 256),
]


def _draw(shape: str, color: str, background: str, size: tuple[int, int],
          rng: np.random.Generator) -> Image.Image:
    width, height = size
    img = Image.new("RGB", size, COLORS[background])
    radius = int(min(size) * rng.uniform(0.25, 0.35))
    cx = int(width / 2 + rng.integers(-width // 10, width // 10 + 1))
    cy = int(height / 2 + rng.integers(-height // 10, height // 10 + 1))
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    draw = ImageDraw.Draw(img)
    if shape == "circle":
        draw.ellipse(box, fill=COLORS[color])
    elif shape == "square":
        draw.rectangle(box, fill=COLORS[color])
    else:
        draw.polygon([(cx, cy - radius), (cx + radius, cy + radius), (cx - radius, cy + radius)],
                     fill=COLORS[color])
    return img


SAMPLE_CONTROLS = "sample-dataset-control"  # the controls' folder, beside the dataset's


def _png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def sample_control_files() -> dict[str, bytes]:
    """Relative path -> bytes of each sample image's control: its background alone."""
    return {f"{CONCEPT_FOLDER}/{number:02d}_{color}_{shape}.png":
            _png(Image.new("RGB", (width, height), COLORS[background]))
            for number, (shape, color, background, width, height) in enumerate(SHAPES)}


def sample_files() -> dict[str, bytes]:
    """Relative path -> bytes of every file of the sample dataset."""
    rng = np.random.default_rng(SAMPLE_SEED)
    files: dict[str, bytes] = {}
    for number, (shape, color, background, width, height) in enumerate(SHAPES):
        stem = f"{CONCEPT_FOLDER}/{number:02d}_{color}_{shape}"
        files[f"{stem}.png"] = _png(_draw(shape, color, background, (width, height), rng))
        files[f"{stem}.txt"] = f"a {color} {shape}, {background} background\n".encode()
    return files


def _write(root: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = root / relative
        if path.is_file() and path.read_bytes() == data:
            continue
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)


def ensure_sample_dataset(root: Path) -> Path:
    """Write the sample dataset under ``root`` (only files that differ) and return ``root``."""
    _write(root, sample_files())
    return root


def resolve_dataset_dir(value: str, data_home: Path) -> Path:
    """The folder named by ``dataset.train_data_dir``: ``embedded:sample-dataset`` is generated
    under ``data_home/embedded/sample-dataset``; anything else is a path."""
    if value == EMBEDDED_DATASET:
        _write(data_home / "embedded" / SAMPLE_CONTROLS, sample_control_files())
        return ensure_sample_dataset(data_home / "embedded" / "sample-dataset")
    return Path(value).expanduser()
