"""The caption editor's data: a folder's images with their captions, edited and saved back.

Pure file logic for the Utilities tab's editor: rows of (image path relative to the folder,
caption), small JPEG thumbnails as data URIs (so no file needs to be served), tag counts the
way ``ss_tag_frequency`` counts them (:func:`trainer.export.metadata.count_tags`), and a save
that writes only the captions that changed, atomically, and only beside images of the folder.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from trainer.tools.common import ToolError

THUMBNAIL = 96


def folder_images(folder: str | Path, recursive: bool = False) -> tuple[Path, list[Path]]:
    from trainer.data.images import is_image_file

    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ToolError(f"folder {str(root)!r}: no such folder")
    pattern = "**/*" if recursive else "*"
    return root, sorted(p for p in root.glob(pattern) if is_image_file(p))


def read_caption(image: Path, extension: str) -> str:
    path = image.with_suffix(extension)
    return path.read_text(encoding="utf-8").strip() if path.is_file() else ""


def read_rows(folder: str | Path, extension: str, recursive: bool = False
              ) -> list[tuple[str, str]]:
    """(image path relative to the folder, its caption or "") of every image."""
    root, images = folder_images(folder, recursive)
    return [(p.relative_to(root).as_posix(), read_caption(p, extension)) for p in images]


def image_controls(folder: str | Path, names: list[str], control_dir: str
                   ) -> tuple[list[list[Path]], list[Path]]:
    """Edit training's pairs: each image's control files (``names`` relative to ``folder``),
    paired as the run pairs them (trainer/data/controls.py: the subfolder named like the
    image's folder first), and the control files that match no image. A relative
    ``control_dir`` is read from ``folder``, as dataset.control_dir is from train_data_dir."""
    from trainer.data.controls import control_root, pair_targets

    root = Path(folder).expanduser()
    controls = control_root(control_dir, root)
    if not controls.is_dir():
        raise ToolError(f"control_dir {str(controls)!r}: no such folder")
    return pair_targets([root / name for name in names], controls)


def thumbnail_uri(path: Path, size: int = THUMBNAIL) -> str:
    """A small JPEG of the image as a ``data:`` URI (empty for an unreadable image)."""
    from trainer.data.images import load_image

    try:
        img = load_image(path).rgb
    except (OSError, ValueError):
        return ""
    img.thumbnail((size, size))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def tag_counts(captions: list[str]) -> list[tuple[str, int]]:
    """Comma-separated tags over all captions, most frequent first."""
    from trainer.export.metadata import count_tags

    return sorted(count_tags(captions).items(), key=lambda item: (-item[1], item[0]))


def _inside(root: Path, name: str) -> Path:
    from trainer.data.images import is_image_file

    path = (root / name).resolve()
    if not path.is_relative_to(root.resolve()) or not is_image_file(path):
        raise ToolError(f"{name!r} is not an image of {root}")
    return path


def save_rows(folder: str | Path, rows: list[tuple[str, str]], extension: str) -> int:
    """Write the captions that differ from the files; returns how many were written."""
    from trainer.tools.caption import write_caption

    root = Path(folder).expanduser()
    changed = []
    for name, caption in rows:
        image = _inside(root, str(name))
        text = " ".join(str(caption or "").split())
        if text != read_caption(image, extension):
            changed.append((image, text))
    for image, text in changed:
        write_caption(image, text, extension)
    return len(changed)
