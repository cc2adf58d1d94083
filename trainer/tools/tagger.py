"""Tags from a WD14-style tagger: an ONNX model and its ``selected_tags.csv``, run by onnxruntime.

The format is that of SmilingWolf's taggers (``SmilingWolf/wd-v1-4-convnext-tagger-v2``,
``wd-swinv2-tagger-v3``, ... on Hugging Face: ``model.onnx`` and ``selected_tags.csv``), which
sd-scripts' ``tag_images_by_wd14_tagger.py`` and the WebUI taggers read:

- the CSV has a header with ``name`` and ``category`` columns, one row per model output, in
  output order; category 9 is a rating, 0 a general tag, 4 a character;
- the model takes [N, H, W, 3] float32 images in BGR order with values 0..255, padded to a
  square with white and resized to H = W (448), and outputs [N, tags] probabilities.

Kept: general tags at or above ``general_threshold``, characters at or above
``character_threshold``, most likely first, without ``exclude_tags``; with ``rating`` the most
likely rating tag comes first. ``underscores_to_spaces`` turns ``long_hair`` into ``long hair``
but leaves tags of three characters or fewer alone (emoticons such as ``^_^``), as the WebUI
taggers do.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.tools.common import ToolError
from trainer.tools.options import TagOptions

GENERAL, CHARACTER, RATING = 0, 4, 9
DEFAULT_SIZE = 448


@dataclass(frozen=True)
class Tag:
    name: str
    category: int


def read_tags(path: Path) -> list[Tag]:
    """The rows of ``selected_tags.csv``, in output order."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ToolError(f"{path}: cannot read the tag list ({exc})") from None
    if not rows or not {"name", "category"} <= set(rows[0]):
        raise ToolError(f"{path}: expected a CSV with 'name' and 'category' columns")
    try:
        return [Tag(row["name"], int(row["category"])) for row in rows]
    except ValueError as exc:
        raise ToolError(f"{path}: a category is not a number ({exc})") from None


def display_name(tag: str, underscores_to_spaces: bool) -> str:
    return tag.replace("_", " ") if underscores_to_spaces and len(tag) > 3 else tag


def preprocess(image: Any, size: int) -> np.ndarray:
    """[size, size, 3] float32 BGR 0..255: padded to a square with white, then resized."""
    from PIL import Image

    image = image.convert("RGB")
    side = max(image.size)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    square = square.resize((size, size), Image.Resampling.BICUBIC)
    return np.asarray(square, dtype=np.float32)[:, :, ::-1].copy()


def select_tags(probs: np.ndarray, tags: list[Tag], opts: TagOptions) -> list[str]:
    """The tags one image gets, in the order they are written."""
    exclude = {display_name(t.strip(), opts.underscores_to_spaces) for t in opts.exclude_tags}

    def kept(category: int, threshold: float) -> list[str]:
        found = [(float(p), display_name(t.name, opts.underscores_to_spaces))
                 for p, t in zip(probs, tags) if t.category == category and p >= threshold]
        return [name for _, name in sorted(found, key=lambda x: -x[0]) if name not in exclude]

    general = kept(GENERAL, opts.general_threshold)
    character = kept(CHARACTER, opts.character_threshold)
    out = character + general if opts.character_tags_first else general + character
    ratings = [(float(p), t.name) for p, t in zip(probs, tags) if t.category == RATING]
    if opts.rating and ratings:
        best = display_name(max(ratings)[1], opts.underscores_to_spaces)
        if best not in exclude:
            out.insert(0, best)
    return out


def _session(model: Path):
    import onnxruntime as ort

    preferred = ("CUDAExecutionProvider", "ROCMExecutionProvider", "CPUExecutionProvider")
    available = ort.get_available_providers()
    providers = [p for p in preferred if p in available] or available
    try:
        return ort.InferenceSession(str(model), providers=providers)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise ToolError(f"{model}: onnxruntime cannot load it ({exc})") from None


class Tagger:
    """A callable ``list[PIL.Image] -> list[str]`` (captions of comma-separated tags)."""

    def __init__(self, model: Path, tags: list[Tag], opts: TagOptions):
        self.session, self.tags, self.opts = _session(model), tags, opts
        info = self.session.get_inputs()[0]
        shape = list(info.shape)
        if len(shape) != 4 or shape[-1] != 3:
            raise ToolError(f"{model}: input {info.name} is {shape}; a WD14 tagger takes "
                            f"[N, H, W, 3] images")
        self.input = info.name
        self.size = shape[1] if isinstance(shape[1], int) and shape[1] > 0 else DEFAULT_SIZE
        self.batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None

    def probabilities(self, images: list[Any]) -> np.ndarray:
        batch = np.stack([preprocess(img, self.size) for img in images])
        step = self.batch or len(batch)
        out = [self.session.run(None, {self.input: batch[i:i + step]})[0]
               for i in range(0, len(batch), step)]
        probs = np.concatenate(out)
        if probs.shape[-1] != len(self.tags):
            raise ToolError(f"the model gives {probs.shape[-1]} outputs but selected_tags.csv "
                            f"lists {len(self.tags)} tags")
        return probs

    def __call__(self, images: list[Any]) -> list[str]:
        return [", ".join(select_tags(p, self.tags, self.opts))
                for p in self.probabilities(images)]


def load_tagger(opts: TagOptions) -> Tagger:
    folder = Path(opts.model_dir).expanduser()
    model = folder / "model.onnx"
    if not model.is_file():
        onnx = sorted(folder.glob("*.onnx")) if folder.is_dir() else []
        if not onnx:
            raise ToolError(f"model_dir {str(folder)!r}: no model.onnx (a WD14 tagger folder "
                            f"holds model.onnx and selected_tags.csv)")
        model = onnx[0]
    return Tagger(model, read_tags(folder / "selected_tags.csv"), opts)
