"""The validation images of a run: a held-out fraction of the training images, or a folder.

``dataset.validation_split`` holds out a fraction of the training images (never regularization
images). Which ones is decided by a hash of ``training.seed`` and each image's folder and file
name, not by its position in the list, so the same images are held out on every run and on
every machine, and adding an image to the dataset moves at most that one into or out of the
held-out set. Held-out images are not trained on. ``dataset.validation_data_dir`` is a folder in
the same ``N_concept`` layout whose images are only validated on (its repeats are ignored).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .buckets import BucketSpec
from .discover import ImageEntry, scan_root, validate

FIELD_SPLIT = "dataset.validation_split"
FIELD_DIR = "dataset.validation_data_dir"


def _rank(entry: ImageEntry, seed: int) -> str:
    key = f"{seed}/{entry.folder.path.name}/{entry.path.name}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def held_out_count(images: int, fraction: float) -> int:
    """How many of ``images`` a split of ``fraction`` holds out: at least one."""
    return max(1, round(images * fraction))


def split_entries(entries: list[ImageEntry], fraction: float, seed: int
                  ) -> tuple[list[ImageEntry], list[ImageEntry]]:
    """(trained, held out): the training images whose seeded hash ranks lowest are held out;
    regularization images always train. Both lists keep the input order."""
    candidates = [e for e in entries if not e.is_reg]
    if not candidates:
        return list(entries), []
    count = held_out_count(len(candidates), fraction)
    chosen = {e.path for e in sorted(candidates, key=lambda e: _rank(e, seed))[:count]}
    return ([e for e in entries if e.path not in chosen],
            [e for e in candidates if e.path in chosen])


def validation_entries(cfg: Any, entries: list[ImageEntry], warn: Callable[[str], None],
                       problems: list[str]) -> tuple[list[ImageEntry], list[ImageEntry]]:
    """(trained, validation) for ``cfg``; problems are appended, not raised."""
    ds = cfg.dataset
    if ds.validation_split is not None and ds.validation_data_dir is not None:
        problems.append(f"{FIELD_SPLIT} and {FIELD_DIR} are both set: validate either on a "
                        f"held-out fraction or on a folder; unset one of them")
        return entries, []
    if ds.validation_data_dir is not None:
        found = scan_root(Path(ds.validation_data_dir).expanduser(), FIELD_DIR,
                          ds.caption_extension, False, warn, problems,
                          wildcard=ds.enable_wildcard)
        return entries, validate(found, BucketSpec.from_config(ds), problems)
    if ds.validation_split is None:
        return entries, []
    trained, held = split_entries(entries, ds.validation_split, cfg.training.seed)
    if held and not any(not e.is_reg for e in trained):
        problems.append(f"{FIELD_SPLIT} = {ds.validation_split} holds out all "
                        f"{len(held)} training image(s): nothing would be left to train on; "
                        f"lower it or add images")
    return trained, held
