"""Check dataset for an edit model: the image pairs (target, its controls, caption).

An edit family (one whose ``FamilySpec.controls.max`` is above 0) trains on a target image, the
control (reference) images it was made from and an instruction caption. This part of the check
shows, per concept folder, how many targets found their controls, the targets missing one
(where the family needs one), the control files that match no target, and some pairs as small
thumbnails. The pairing is the run's own (``trainer.data.controls.control_files``, on the
images the run's own scan finds), read even when the dataset has problems, so that a missing
or stray control can be seen beside the list of problems. Thumbnails are ``data:`` URIs: no
file of the dataset is served.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from kohya_gui.safe_text import md
from trainer.config import TrainConfig

SHOWN_PAIRS = 6  # pairs drawn as thumbnails
SHOWN_NAMES = 10  # missing targets and orphan controls named
THUMBNAIL = 64


@dataclass
class ConceptPairs:
    """One concept folder's count: its targets, those with controls, those without."""

    targets: int = 0
    paired: int = 0
    missing: list[Path] = field(default_factory=list)  # fewer controls than the family needs
    without: int = 0  # no control at all (optional for the family, or missing)
    orphans: int = 0


def edit_controls(cfg: TrainConfig) -> Optional[Any]:
    """The ``ControlSpec`` of the config's model when it is an edit family; None otherwise
    (not an edit model, or a model whose family cannot be told before loading it)."""
    from trainer.data.controls import data_family
    from trainer.families import spec

    family = data_family(cfg)
    if family is None:
        return None
    wanted = spec(family).controls
    return wanted if wanted.max > 0 else None


def cell(text: Any, limit: int = 200) -> str:
    """Text for a Markdown table cell (a ``|`` would end the cell)."""
    return md(text, limit).replace("|", "&#124;")


def thumb(path: Path) -> str:
    from trainer.tools.caption_table import thumbnail_uri

    uri = thumbnail_uri(path, THUMBNAIL)
    return f"![{cell(path.name, 80)}]({uri})" if uri else cell(path.name, 80)


def _by_concept(entries: list[Any], files: list[Optional[list[Path]]], orphans: list[Path],
                required: int) -> dict[str, ConceptPairs]:
    out: dict[str, ConceptPairs] = {}
    for entry, found in zip(entries, files):
        if found is None:
            continue  # a regularization image, or a subset without a control folder
        row = out.setdefault(entry.folder.path.name, ConceptPairs())
        row.targets += 1
        row.paired += bool(found)
        row.without += not found
        if len(found) < required:
            row.missing.append(entry.path)
    for path in orphans:  # in a concept's own subfolder, or in the control folder itself
        name = path.parent.name if path.parent.name in out else "(control folder)"
        out.setdefault(name, ConceptPairs()).orphans += 1
    return out


def _count_table(rows: dict[str, ConceptPairs]) -> list[str]:
    head = "| concept folder | targets | with controls | without a control | orphan controls |"
    lines = [head, "|---|---:|---:|---:|---:|"]
    for name, row in rows.items():
        lines.append(f"| {cell(name, 120)} | {row.targets} | {row.paired} | {row.without} "
                     f"| {row.orphans} |")
    return lines


def _names(title: str, paths: list[Path]) -> list[str]:
    if not paths:
        return []
    more = f" (and {len(paths) - SHOWN_NAMES} more)" if len(paths) > SHOWN_NAMES else ""
    return ["", f"{title}{more}:", *(f"- {md(p, 300)}" for p in paths[:SHOWN_NAMES])]


def _gallery(entries: list[Any], files: list[Optional[list[Path]]]) -> list[str]:
    pairs = [(e, f) for e, f in zip(entries, files) if f][:SHOWN_PAIRS]
    if not pairs:
        return []
    lines = ["", "| target | controls | caption |", "|---|---|---|"]
    for entry, found in pairs:
        controls = " ".join(thumb(p) for p in found)
        lines.append(f"| {thumb(entry.path)} | {controls} | {cell(entry.caption, 300)} |")
    return lines


def pairs_markdown(cfg: TrainConfig) -> str:
    """The pairs section of the check for an edit family ("" for any other model)."""
    from trainer.data.controls import control_files, data_family
    from trainer.data.dataset import scan_dataset
    from trainer.families import label

    wanted = edit_controls(cfg)
    if wanted is None:
        return ""
    name = label(data_family(cfg))
    scan_problems: list[str] = []
    try:
        entries, train_dir = scan_dataset(cfg, lambda _msg: None, scan_problems, None)
    except (OSError, ValueError):
        return ""  # the check's own lines say what is wrong with the folders
    found = control_files(cfg, entries, train_dir)
    if all(f is None for f in found.files):  # no control folder, or one that cannot be read
        why = "; ".join(md(p, 300) for p in found.problems) or (
            "no control folder is set; set dataset.control_dir to the folder of the control "
            "images to train edits")
        return f"**Image pairs ({md(name)}):** {why}"
    rows = _by_concept(entries, found.files, found.orphans, wanted.required)
    missing = [p for row in rows.values() for p in row.missing]
    total = sum(r.targets for r in rows.values())
    paired = sum(r.paired for r in rows.values())
    need = (f"{name} needs {wanted.required} control(s) per target" if wanted.required
            else f"a control is optional for {name}")
    lines = [f"**Image pairs ({md(name)}): {paired} of {total} target(s) with their controls, "
             f"{len(missing)} missing, {len(found.orphans)} orphan control(s)** ({need}, "
             f"up to {wanted.max})", "", *_count_table(rows)]
    lines += _names("Targets missing a control", missing)
    lines += _names("Control images that match no target", found.orphans)
    return "\n".join(lines + _gallery(entries, found.files))
