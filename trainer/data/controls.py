"""Edit training's control images: found beside the targets, paired by file stem, checked.

A control (reference) image is the picture an edit starts from; the training image is the edit's
result (the target). Controls sit in their own folder, ``dataset.control_dir`` (a relative path
is read from train_data_dir), or per subset of a dataset TOML, ``control_directory``
(musubi-tuner's key). A control shares its target's stem: ``10_night/001.png`` pairs with
``001.png`` (any image extension); several references are numbered after an underscore,
``001_0.png``, ``001_1.png`` (or ``001_0000.png``, as musubi-tuner accepts), and are used in the
order of their numbers, an unnumbered one first. For a kohya folder the subfolder named like
the concept folder is searched first (``control/10_night/001.png``), then the folder itself.

How many controls a sample may have, and whether it needs one, is the family's
(``FamilySpec.controls``); the problems name the file and the setting, one line each:
a target without the control its family needs, a control that matches no target, a control
that does not decode, two files for one reference, more controls than the family takes.
Regularization images have no controls.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .images import inspect_image, is_image_file

_NUMBERED = re.compile(r"^(.*)_(\d+)$", re.DOTALL)
SETTING = "dataset.control_dir"


@dataclass(frozen=True)
class ControlImage:
    """One validated control image: its displayed size and the hash of its bytes."""

    path: Path
    size: tuple[int, int]
    content_hash: str


@dataclass(frozen=True)
class ControlSet:
    """The controls of one target, in reference order; ``where`` names the setting (or the
    dataset TOML's key) that gave their folder, for messages."""

    where: str
    folder: Path
    images: tuple[ControlImage, ...]
    unreadable: int = 0  # its control files that do not decode (each a problem of its own)


def pair_by_stem(target_stems: set[str], files: list[Path]
                 ) -> tuple[dict[str, list[Path]], list[Path], list[list[Path]]]:
    """Pair the control ``files`` of one folder with the target stems: (stem -> its controls in
    reference order, files that match no stem, groups of files that claim the same reference).
    A file whose whole stem is a target's belongs to it even when it also reads as a numbered
    reference of a shorter one (``img_1.png`` is target ``img_1``'s before ``img``'s)."""
    by_stem: dict[str, list[tuple[int, Path]]] = {}  # a stem -> (order, file) it could claim
    for path in sorted(files):
        by_stem.setdefault(path.stem, []).append((-1, path))
        numbered = _NUMBERED.match(path.stem)
        if numbered:
            by_stem.setdefault(numbered.group(1), []).append((int(numbered.group(2)), path))
    taken: set[Path] = set()
    paired: dict[str, list[Path]] = {}
    clashes: list[list[Path]] = []
    for stem in sorted(target_stems, key=lambda s: (-len(s), s)):  # the longest claims first
        orders: dict[int, list[Path]] = {}
        for order, path in by_stem.get(stem, []):
            if path not in taken:
                orders.setdefault(order, []).append(path)
        if not orders:
            continue
        taken.update(p for group in orders.values() for p in group)
        clashes += [group for _, group in sorted(orders.items()) if len(group) > 1]
        paired[stem] = [group[0] for _, group in sorted(orders.items())]
    return paired, [p for p in sorted(files) if p not in taken], clashes


def _images(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if is_image_file(p)] if folder.is_dir() else []


@dataclass
class _Search:
    """One control folder and the targets (entry indices) that look in it, in search order."""

    where: str
    root: Path
    subfolder: bool  # kohya layout: a subfolder named like the concept folder comes first


def search_for(cfg: Any, entry: Any, train_dir: Path) -> Optional[_Search]:
    """Where ``entry``'s controls are looked for; None when it has none (a regularization
    image, no control folder set)."""
    opts = entry.folder.options
    if entry.is_reg:
        return None
    if opts is not None:
        if opts.control_dir is None:
            return None
        toml = Path(cfg.dataset.dataset_config).expanduser()
        return _Search(f"dataset.dataset_config ({toml}): {opts.where}.control_directory",
                       opts.control_dir, False)
    if cfg.dataset.control_dir is None:
        return None
    return _Search(SETTING, control_root(cfg.dataset.control_dir, train_dir), True)


def control_root(value: str, train_dir: Path) -> Path:
    """``dataset.control_dir``: an absolute path, or one relative to train_data_dir."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else train_dir / path


def _pairs(searches: list[Optional[_Search]], entries: list[Any], problems: list[str],
           orphan_files: Optional[list[Path]] = None) -> dict[int, list[Path]]:
    """Entry index -> its control files; orphans and clashes become problems (and the orphans
    are added to ``orphan_files`` too, when given)."""
    inner: dict[Path, tuple[str, list[int]]] = {}  # a folder -> its setting, its targets
    roots: dict[Path, tuple[str, list[int]]] = {}
    for index, (search, entry) in enumerate(zip(searches, entries)):
        if search is None:
            continue
        if search.subfolder:  # the concept's own subfolder is searched first
            folder = search.root / entry.folder.path.name
            inner.setdefault(folder, (search.where, []))[1].append(index)
        roots.setdefault(search.root, (search.where, []))[1].append(index)
    found: dict[int, list[Path]] = {}
    for folder, (where, members) in [*inner.items(), *roots.items()]:
        # a stem already served by its concept's subfolder keeps the root's files unused
        paired, orphans, clashes = pair_by_stem({entries[i].path.stem for i in members},
                                                _images(folder))
        for i in members:
            if i not in found and entries[i].path.stem in paired:
                found[i] = paired[entries[i].path.stem]
        if orphan_files is not None:
            orphan_files += orphans
        problems += [f"{where}: control image {p} matches no training image (none named "
                     f"{_target_stem(p.stem)}.* in "
                     f"{'its concept folder' if folder in inner else 'the dataset'}); rename "
                     f"or remove it" for p in orphans]
        problems += [f"{where}: {', '.join(map(str, group))} are the same reference of one "
                     f"training image; keep one of them" for group in clashes]
    return found


def _target_stem(stem: str) -> str:
    numbered = _NUMBERED.match(stem)
    return numbered.group(1) if numbered else stem


def _folder_problems(searches: list[Optional[_Search]], entries: list[Any]) -> list[str]:
    """Control folders that do not exist, or that hold training images."""
    roots = {s.root: s.where for s in searches if s is not None}
    missing = [f"{where}: folder {root} does not exist; create it with the control images "
               f"(named like their training images) or unset it"
               for root, where in roots.items() if not root.is_dir()]
    images = {e.folder.path.resolve() for e in entries}
    return missing + [f"{where}: {root} is a folder of training images; keep the control "
                      f"images in a folder of their own" for root, where in roots.items()
                      if root.is_dir() and root.resolve() in images]


@dataclass(frozen=True)
class ControlFiles:
    """The run's pairing of a dataset's images with their control files, without decoding any
    (for the GUI's dataset check): per image its control files in reference order (None: it
    looks in no control folder), the control files that match no image, and the problems."""

    files: list[Optional[list[Path]]]
    orphans: list[Path]
    problems: list[str]


def control_files(cfg: Any, entries: list[Any], train_dir: Path) -> ControlFiles:
    """:class:`ControlFiles` of ``entries`` (found images, training and held-out alike:
    anything with ``path``, ``folder`` and ``is_reg``) as the run pairs them."""
    searches = [search_for(cfg, e, train_dir) for e in entries]
    problems = _folder_problems(searches, entries) if any(searches) else []
    if problems:
        return ControlFiles([None] * len(entries), [], problems)
    orphans: list[Path] = []
    found = _pairs(searches, entries, problems, orphans)
    return ControlFiles([None if s is None else found.get(i, [])
                         for i, s in enumerate(searches)], orphans, problems)


@dataclass(frozen=True)
class _Target:
    path: Path
    folder: Any


def pair_targets(targets: list[Path], root: Path) -> tuple[list[list[Path]], list[Path]]:
    """The run's pairing for plain image files (a folder of the caption editor): each
    target's control files in ``root`` (the subfolder named like the target's folder first,
    as for ``dataset.control_dir``), and the control files that match no target."""
    entries = [_Target(t, _Target(t.parent, None)) for t in targets]
    orphans: list[Path] = []
    found = _pairs([_Search(SETTING, root, True)] * len(entries), entries, [], orphans)
    return [found.get(i, []) for i in range(len(entries))], orphans


def _inspect(path: Path) -> tuple[Optional[ControlImage], Optional[str]]:
    try:
        info = inspect_image(path)
    except (OSError, ValueError) as exc:
        return None, f"control image {path}: {exc}"
    return ControlImage(path, info.size, info.content_hash), None


def find_controls(cfg: Any, entries: list[Any], train_dir: Path, problems: list[str],
                  held_out: list[Any]) -> tuple[Optional[list], Optional[list]]:
    """Each training entry's :class:`ControlSet` (None: it has no control folder), and each
    held-out (validation) image's; None for both when no control folder is set. Problems
    (orphans, clashes, files that do not decode, missing folders) are appended; the controls
    of held-out images are no orphans. How many a family takes is :func:`count_problems`'s."""
    found = _find(cfg, [*entries, *held_out], train_dir, problems)
    if found is None or not any(found[:len(entries)]):
        return None, None
    return found[:len(entries)], found[len(entries):]


def _find(cfg: Any, entries: list[Any], train_dir: Path, problems: list[str]
          ) -> Optional[list[Optional[ControlSet]]]:
    searches = [search_for(cfg, e, train_dir) for e in entries]
    if not any(searches):
        return None
    missing = _folder_problems(searches, entries)
    if missing:
        problems += missing
        return None
    found = _pairs(searches, entries, problems)
    files = sorted({p for paths in found.values() for p in paths})
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        checked = dict(zip(files, pool.map(_inspect, files)))
    problems += [problem for _, problem in checked.values() if problem]
    out: list[Optional[ControlSet]] = []
    for i, search in enumerate(searches):
        good = [checked[p][0] for p in found.get(i, [])]
        out.append(None if search is None else ControlSet(
            search.where, search.root, tuple(c for c in good if c is not None),
            sum(c is None for c in good)))
    return out


def count_problems(controls: Optional[list[Optional[ControlSet]]], entries: list[Any],
                   family: str) -> list[str]:
    """What ``family`` (a value of model.model_version) cannot train of these controls: any at
    all when it is not an edit model, more than it takes, fewer than it needs."""
    from trainer.config.rules.edit import not_edit_message
    from trainer.families import label, spec

    if not controls:
        return []
    wanted, name, problems = spec(family).controls, label(family), []
    if wanted.max == 0:
        wheres = dict.fromkeys(c.where for c in controls if c is not None)
        return [not_edit_message(where, family) for where in wheres]
    for entry, found in zip(entries, controls):
        if found is None:
            continue
        problems += [f"{found.where}: {why}" for c in found.images
                     if (why := size_problem(c, wanted, name))]
        count = len(found.images) + found.unreadable  # a broken one is a line of its own
        if count > wanted.max:
            names = ", ".join(c.path.name for c in found.images)
            problems.append(f"{found.where}: {entry.path} has {count} control images ({names}) "
                            f"but {name} takes at most {wanted.max}; remove the extra ones")
        elif count < wanted.required:
            has = f"only {count} control image(s)" if count else "no control image"
            problems.append(f"{found.where}: {entry.path} has {has} in "
                            f"{found.folder} (named {entry.path.stem}.png, or "
                            f"{entry.path.stem}_0.png for several); {name} needs "
                            f"{wanted.required} per training image")
    return problems



def size_problem(image: ControlImage, wanted: Any, name: str) -> Optional[str]:
    """Why ``name``'s pipeline would refuse this control file (``wanted``: its ControlSpec's
    ``min_side`` and ``max_aspect``), or None."""
    w, h = image.size
    if wanted.min_side and min(w, h) < wanted.min_side:
        return (f"control image {image.path} is {w}x{h}; {name} takes references of at least "
                f"{wanted.min_side} px a side (its pipeline refuses smaller ones); use a "
                f"larger image or remove it")
    if wanted.max_aspect and max(w, h) > wanted.max_aspect * min(w, h):
        return (f"control image {image.path} is {w}x{h}, {max(w, h) / min(w, h):.1f}:1; "
                f"{name} takes references of at most {wanted.max_aspect:g}:1 (its pipeline "
                f"refuses longer ones); crop it or remove it")
    return None


def data_family(cfg: Any) -> Optional[str]:
    """The family of the run's model as far as it is known before loading it: the config's,
    else the loader's detection (headers only); None where it cannot tell yet (the run then
    checks the controls again with the loaded model's: trainer/run/caches.py)."""
    from trainer.config.rules.family import known_family
    from trainer.families import family_or_none

    return known_family(cfg) or family_or_none(cfg.model.pretrained_model_name_or_path)
