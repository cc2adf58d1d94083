"""Caption a folder of images: which images, what is written beside them, and the two captioners.

A caption is written beside its image as ``<stem><caption_extension>`` (the layout the dataset
reader and sd-scripts read), with the prefix and suffix joined by ", " as the trainer joins
them (:func:`trainer.data.captions.full_caption`). Existing caption files are kept unless
``overwrite`` is on. Images are opened as training opens them (:func:`load_image`: EXIF
orientation applied, transparency on white). Each file is written atomically.

The captioners are callables ``list[PIL.Image] -> list[str]``:
:func:`trainer.tools.caption_model.load_captioner` (a transformers image-to-text model) and
:func:`trainer.tools.tagger.load_tagger` (a WD14-style ONNX tagger).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.tools.common import Progress, ToolError, no_progress
from trainer.tools.options import CaptionFolderOptions, CaptionOptions, TagOptions

Captioner = Callable[[list[Any]], list[str]]


@dataclass
class CaptionReport:
    folder: str
    written: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # had a caption, not overwritten
    failed: list[str] = field(default_factory=list)  # "name: why"
    seconds: float = 0.0
    samples: list[tuple[str, str]] = field(default_factory=list)  # (image, caption), a few


def caption_path(image: Path, extension: str) -> Path:
    return image.with_suffix(extension)


def find_images(opts: CaptionFolderOptions) -> tuple[list[Path], list[Path]]:
    """(images to caption, images whose caption is kept), sorted by path."""
    from trainer.data.images import is_image_file

    folder = Path(opts.folder).expanduser()
    if not folder.is_dir():
        raise ToolError(f"folder {str(folder)!r}: no such folder")
    pattern = "**/*" if opts.recursive else "*"
    images = sorted(p for p in folder.glob(pattern) if is_image_file(p))
    if not images:
        raise ToolError(f"folder {str(folder)!r}: no .png, .jpg, .jpeg, .webp or .bmp images")
    has_caption = {p for p in images if caption_path(p, opts.caption_extension).exists()}
    if opts.overwrite:
        return images, []
    return [p for p in images if p not in has_caption], sorted(has_caption)


def compose(caption: str, opts: CaptionFolderOptions) -> str:
    from trainer.data.captions import CaptionOptions as Parts
    from trainer.data.captions import full_caption

    return full_caption(caption, Parts(prefix=opts.prefix, suffix=opts.suffix))


def write_caption(image: Path, text: str, extension: str) -> Path:
    from trainer.system.safe_write import atomic_path

    path = caption_path(image, extension)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")
    return path


def _open(paths: list[Path], report: CaptionReport) -> tuple[list[Path], list[Any]]:
    from trainer.data.images import load_image

    ok, images = [], []
    for path in paths:
        try:
            images.append(load_image(path).rgb)
            ok.append(path)
        except (OSError, ValueError) as exc:
            report.failed.append(f"{path.name}: {exc}")
    return ok, images


def caption_folder(opts: CaptionFolderOptions, captioner: Captioner,
                   progress: Progress = no_progress) -> CaptionReport:
    """Caption the folder's images in batches of ``opts.batch_size``."""
    started = time.perf_counter()
    todo, kept = find_images(opts)
    report = CaptionReport(opts.folder, kept=[str(p) for p in kept])
    progress(0, len(todo), "captioning")
    for start in range(0, len(todo), opts.batch_size):
        paths, images = _open(todo[start:start + opts.batch_size], report)
        texts = captioner(images) if images else []
        for path, text in zip(paths, texts):
            full = compose(text, opts)
            write_caption(path, full, opts.caption_extension)
            report.written.append(str(path))
            if len(report.samples) < 5:
                report.samples.append((path.name, full))
        progress(min(start + opts.batch_size, len(todo)), len(todo), "captioning")
    report.seconds = time.perf_counter() - started
    return report


def caption_with_model(opts: CaptionOptions, progress: Progress = no_progress) -> CaptionReport:
    from trainer.tools.caption_model import load_captioner

    find_images(opts)  # a wrong folder fails before the model loads
    return caption_folder(opts, load_captioner(opts), progress)


def tag_with_tagger(opts: TagOptions, progress: Progress = no_progress) -> CaptionReport:
    from trainer.tools.tagger import load_tagger

    find_images(opts)
    return caption_folder(opts, load_tagger(opts), progress)


def format_caption(report: CaptionReport) -> str:
    lines = [f"{report.folder}: {len(report.written)} captions written, {len(report.kept)} "
             f"kept, {len(report.failed)} failed, in {report.seconds:.1f} s"]
    lines += [f"- {name}: {text}" for name, text in report.samples]
    lines += [f"- failed {f}" for f in report.failed]
    return "\n".join(lines)
