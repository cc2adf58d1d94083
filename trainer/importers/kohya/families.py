"""The model families as the importer reads them: each family's ``kohya`` role
(``trainer/families/<folder>/kohya.py``) declares the kohya_ss keys that pick it (``SWITCHES``)
and, for a flow-matching family, the keys only its sd-scripts trainer reads; this module
gathers them, so that a new family adds its keys in its own folder."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Optional

from trainer.families import names, role


def kohya_role(name: str) -> Optional[ModuleType]:
    """The ``kohya`` role of a family, or None where its folder has none."""
    return role(name, "kohya")


def roles(objective: Optional[str] = None) -> dict[str, ModuleType]:
    """{family: its kohya role} of the families (of one objective) that have one; a role that
    two families of one folder share is the first's (FLUX.1 Kontext shares FLUX.1's folder,
    and kohya_ss has no Kontext: its FLUX.1 tab is FLUX.1)."""
    found: dict[str, ModuleType] = {}
    for name in names(objective=objective):
        module = kohya_role(name)
        if module is not None and module not in found.values():
            found[name] = module
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
