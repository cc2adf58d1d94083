"""The doctor's lines on a base model path (``python -m trainer doctor --model PATH``): what the
loader's detection reads in it (:func:`trainer.families.detect_path`, headers only, no
torch), which parts a FLUX.1 / SD 3.x file holds and which settings name the others, and
whether the family's tokenizers are in the Hugging Face cache."""

from __future__ import annotations

from pathlib import Path


def model_lines(path: str) -> list[str]:
    """Plain-text lines in the doctor's layout."""
    from trainer.families import detect_path, role
    from trainer.families.spec import ModelLoadError

    head = f"  {'Model':<20}"
    if not Path(path).expanduser().exists():
        return [f"{head}{path}: no such file or folder"]
    try:
        found = detect_path(path)
    except ModelLoadError as exc:
        return [f"{head}{path}: cannot tell its family: {exc}"]
    lines = [f"{head}{found.description}, {found.layout}",
             f"  {'':<20}model.model_version = 'auto' reads it as {found.family!r}; train, "
             f"advise and the GUI read it the same way"]
    if found.flow is not None:
        own = getattr(found.flow, "part_lines", None)  # a family whose file facts say it
        lines += [f"  {'':<20}{line}" for line in own()] if own else _parts(found.flow)
    more = getattr(role(found.family, "load"), "doctor_lines", None)  # e.g. a processor
    if more is not None:
        lines += [f"  {'':<20}{line}" for line in more(found)]
    return lines


def _parts(info) -> list[str]:
    from trainer.families.common.mmdit_detect import FILES, REQUIRED, WHERE

    own = getattr(info, "part_lines", None)  # a family's file facts that say it themselves
    if own is not None:
        return [f"  {'':<20}{line}" for line in own()]
    inside = [p for p in REQUIRED[info.kind] if p in info.prefixes]
    missing = [p for p in REQUIRED[info.kind] if p not in info.prefixes]
    lines = [f"  {'':<20}holds: {', '.join(inside)}"]
    lines += [f"  {'':<20}set {WHERE[p]} to {FILES[p]}" for p in missing]
    return lines
