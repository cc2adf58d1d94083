"""Finding the images of a kohya-layout folder and checking them before training.

A dataset folder holds ``N_concept`` subfolders: ``N`` is how often each image is repeated per
epoch, the rest (after the first ``_``) is the caption of images that have no caption file.
Folders without the prefix are skipped with a warning; hidden ones (``.cache``) silently. A
caption file sits beside its image (``img.png`` -> ``img.txt``); its first non-empty line is the
caption. Images are looked for directly in each concept folder (not in subfolders). With
``dataset.dataset_repeats`` the images placed directly in the dataset folder train too, that many
times per epoch (kohya_ss's finetune layout; an image without a caption file has an empty one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .buckets import BucketSpec, size_problem
from .captions import CaptionOptions
from .images import inspect_image, is_image_file

_CONCEPT = re.compile(r"^(\d+)_(.*)$", re.DOTALL)
_TRAIN = "dataset.train_data_dir"  # the one folder whose own images dataset_repeats trains


@dataclass(frozen=True)
class SubsetOptions:
    """The options of one folder that a dataset TOML sets per subset (and per dataset: ``spec``,
    ``dataset``); see trainer/data/dataset_toml.py. A folder without them uses the
    ``dataset`` section's values."""

    caption: CaptionOptions
    spec: BucketSpec
    flip_aug: bool = False
    color_aug: bool = False  # sd-scripts' colour augmentation (trainer/data/color_aug.py)
    random_crop: bool = False
    dataset: int = 0  # which [[datasets]] entry: reg samples are matched per dataset
    where: str = ""  # e.g. "datasets[0].subsets[1]", for messages
    alpha_mask: bool = False  # training.masked_loss: the mask is the alpha channel
    mask_dir: Optional[Path] = None  # training.masked_loss: a folder of mask images
    control_dir: Optional[Path] = None  # edit training: its control images (controls.py)
    control_resolution: Union[int, list[int], None] = None  # musubi-tuner's control sizing
    no_resize_control: bool = False


@dataclass(frozen=True)
class ConceptFolder:
    path: Path
    repeats: int
    concept: str
    options: Optional[SubsetOptions] = None


@dataclass(frozen=True)
class Candidate:
    """An image found on disk, with its caption, not yet validated."""

    path: Path
    caption: str
    folder: ConceptFolder
    is_reg: bool


@dataclass(frozen=True)
class ImageEntry:
    """A validated training image."""

    path: Path
    caption: str
    folder: ConceptFolder
    is_reg: bool
    size: tuple[int, int]  # (width, height) after EXIF orientation
    content_hash: str

    @property
    def repeats(self) -> int:
        return self.folder.repeats


def parse_concept_folder(name: str) -> Optional[tuple[int, str]]:
    """``"10_my cat"`` -> ``(10, "my cat")``; None when the name has no ``N_`` prefix."""
    match = _CONCEPT.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def find_concept_folders(
    root: Path, field: str, warn: Callable[[str], None], root_repeats: Optional[int] = None,
    ignore: frozenset[Path] = frozenset(),
) -> list[ConceptFolder]:
    """The ``N_concept`` subfolders of ``root``, sorted by name; warns about the others (but
    ``ignore``: a control folder kept inside). With ``root_repeats``, ``root`` itself comes
    first (its own images, that many repeats, no concept: the finetune layout of
    dataset.dataset_repeats)."""
    folders, skipped, stray = [], [], []
    for child in sorted(root.iterdir()):
        if child.name.startswith(".") or (ignore and child.resolve() in ignore):
            continue
        if not child.is_dir():
            stray += [child.name] if is_image_file(child) else []
            continue
        parsed = parse_concept_folder(child.name)
        if parsed is None or parsed[0] < 1:
            skipped.append(child.name)
        else:
            folders.append(ConceptFolder(child, parsed[0], parsed[1]))
    if skipped:
        warn(
            f"{field}: skipped folder(s) without an N_concept name (N = repeats, at least 1): "
            + ", ".join(skipped)
        )
    if root_repeats is not None:
        folders.insert(0, ConceptFolder(root, root_repeats, ""))
    elif stray:
        warn(f"{field}: ignored image(s) outside an N_concept folder: " + ", ".join(stray)
             + (" (set dataset.dataset_repeats to train them)" if field == _TRAIN else ""))
    return folders


def read_caption(image: Path, extension: str, fallback: str, all_lines: bool = False) -> str:
    """The caption of ``image``: the first non-empty line of its caption file (with
    ``all_lines``, every non-empty line, joined by newlines: wildcard captions), else
    ``fallback``.

    Raises ``ValueError`` when the caption file is not UTF-8.
    """
    path = image.with_suffix(extension)
    if not path.is_file():
        return fallback
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: caption file is not UTF-8 (invalid byte at position {exc.start}); "
            "re-save it as UTF-8"
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return fallback
    return "\n".join(lines) if all_lines else lines[0]


def scan_root(
    root: Path,
    field: str,
    caption_extension: str,
    is_reg: bool,
    warn: Callable[[str], None],
    problems: list[str],
    required: bool = True,
    root_repeats: Optional[int] = None,
    wildcard: bool = False,
    ignore: frozenset[Path] = frozenset(),
) -> list[Candidate]:
    """Every image under the concept folders of ``root`` (and directly in it, with
    ``root_repeats``); problems are appended, not raised. With ``required`` off, a missing or
    empty ``root`` is no problem (it will be filled). ``wildcard``: keep every line of the
    caption files."""
    if not required and not root.is_dir():
        return []
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        problems.append(
            f"{field}: {root} {what}; set it to a folder of N_concept subfolders "
            "(e.g. 10_mycat/ holding the images and their caption files)"
            + (", or unset it" if is_reg else ", or to embedded:sample-dataset")
        )
        return []
    found: list[Candidate] = []
    for folder in find_concept_folders(root, field, warn, root_repeats, ignore):
        found += scan_folder(folder, caption_extension, is_reg, problems, wildcard)
    if root_repeats is not None:
        bare = [c.path.name for c in found
                if c.folder.path == root and not c.path.with_suffix(caption_extension).is_file()]
        if bare:
            warn(f"{field}: {len(bare)} image(s) directly in {root} have no {caption_extension} "
                 f"caption file and train with an empty caption: " + ", ".join(bare[:5])
                 + (", ..." if len(bare) > 5 else ""))
    if not found and required:
        problems.append(
            f"{field}: no images found in {root}; it needs N_concept subfolders (e.g. 10_mycat/) "
            "holding .png, .jpg, .jpeg, .webp or .bmp images"
            + (", or images directly in it with dataset.dataset_repeats set"
               if field == _TRAIN else "")
        )
    return found


def scan_folder(folder: ConceptFolder, caption_extension: str, is_reg: bool,
                problems: list[str], wildcard: bool = False) -> list[Candidate]:
    """The images directly in ``folder``, sorted by name, with their captions (the folder's
    concept where an image has no caption file; every line of it with wildcards, which a
    dataset TOML's subset sets for itself); unreadable captions become problems."""
    if folder.options is not None:
        wildcard = folder.options.caption.wildcard != "off"
    found = []
    for path in sorted(p for p in folder.path.iterdir() if is_image_file(p)):
        try:
            caption = read_caption(path, caption_extension, folder.concept, wildcard)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        found.append(Candidate(path, caption, folder, is_reg))
    return found


def _check(candidate: Candidate, spec: BucketSpec) -> tuple[Optional[ImageEntry], Optional[str]]:
    try:
        info = inspect_image(candidate.path)
    except (OSError, ValueError) as exc:
        return None, f"{candidate.path}: {exc}"
    options = candidate.folder.options
    reason = size_problem(info.size, options.spec if options else spec)
    if reason and options:  # a dataset TOML: its dataset's bucket options are the ones to change
        reason = reason.replace("dataset.", f"{options.where.split('.')[0]}.")
    if reason:
        return None, f"{candidate.path}: {reason}"
    entry = ImageEntry(
        candidate.path, candidate.caption, candidate.folder, candidate.is_reg,
        info.size, info.content_hash,
    )
    return entry, None


def validate(
    candidates: list[Candidate], spec: BucketSpec, problems: list[str]
) -> list[ImageEntry]:
    """Decode every image once (in threads); bad ones become problems, in the input order."""
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda c: _check(c, spec), candidates))
    entries = []
    for entry, problem in results:
        if problem:
            problems.append(problem)
        elif entry is not None:
            entries.append(entry)
    return entries
