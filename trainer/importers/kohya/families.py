"""The model families as the importer reads them: each family's ``kohya`` role
(``trainer/families/<folder>/kohya.py``) declares the kohya_ss keys that pick it (``SWITCHES``)
and, for a flow-matching family, the keys only its sd-scripts trainer reads; this module
gathers them, so that a new family adds its keys in its own folder."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Optional

from trainer.families import FAMILIES, names, role


def kohya_role(name: str) -> Optional[ModuleType]:
    """The ``kohya`` role of a family, or None where its folder has none."""
    return role(name, "kohya")


def roles(objective: Optional[str] = None) -> dict[str, ModuleType]:
    """{family: its kohya role} of the families (of one objective) that have one; a role that
    two families of one folder share under one kohya version is the first's (FLUX.1 Kontext
    shares FLUX.1's folder and its ``flux1``, and kohya_ss has no Kontext: its FLUX.1 tab is
    FLUX.1), while SD 1.x and SD 2.x, one folder of two versions, keep it each."""
    found: dict[str, ModuleType] = {}
    taken: set[tuple[int, str]] = set()
    for name in names(objective=objective):
        module = kohya_role(name)
        key = (id(module), FAMILIES[name].kohya_version)
        if module is not None and key not in taken:
            found[name] = module
            taken.add(key)
    return found


def switches(objective: Optional[str] = None) -> dict[str, tuple[str, ...]]:
    """{family: the kohya_ss keys that pick it, the one that decides first}, in the registry's
    order; a family without a switch (SD 1.x, what sd-scripts takes without one) is absent."""
    return {name: module.SWITCHES[name] for name, module in roles(objective).items()
            if name in getattr(module, "SWITCHES", {})}


def switch_keys(objective: Optional[str] = None) -> tuple[str, ...]:
    return tuple(k for keys in switches(objective).values() for k in keys)


def raw_on(value: Any) -> bool:
    """A switch's value as kohya_ss's own checks read it (a bool or its text)."""
    return value in (True, "true", "True")


def role_value(name: Optional[str], attribute: str, default: Any = None) -> Any:
    """An attribute of a family's kohya role (``default`` without a family, role or attribute)."""
    module = kohya_role(name) if name is not None else None
    return getattr(module, attribute, default)
