"""Edit training: which families take control images, and the refusal of controls for the others.

A family takes control (reference) images when its spec says so (``FamilySpec.controls.max``,
trainer/families/spec.py); the settings that only those families read carry the ``families``
hint :data:`trainer.config.sections.base.EDIT`. Every message here is phrased from the
registry, so that a family that declares controls is named without an edit to this file.
"""

from __future__ import annotations

from trainer.families import FAMILIES, VERSIONS, label, spec


def edit_families() -> tuple[str, ...]:
    """The families whose spec takes control images, in the registry's order."""
    return tuple(n for n, s in FAMILIES.items() if s.controls.max > 0)


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def needs_edit_model() -> str:
    """What edit training needs, from the registry."""
    takers = []
    for n in edit_families():  # a family, and the variants only the setting names in a file
        named = [f"{label(v)} ({v!r})" for v, (f, _) in VERSIONS.items() if f == n]
        takers.append(f"{label(n)} (model.model_version = {n!r})" +
                      (f" with an edit model: its folder, or a file named {_either(named)}"
                       if named else ""))
    if not takers:
        return "none of the model families here takes control images yet"
    return f"edit training needs {_either(takers)}"


def not_edit_message(key: str, family: str) -> str:
    """Why control images (the setting or file ``key``) are refused for ``family``."""
    return (f"{key} is set but {label(family)} is not an edit model (it takes no control "
            f"images); {needs_edit_model()}; unset it to train on the images alone")


def takes_controls(family: str) -> bool:
    return spec(family).controls.max > 0
