"""What every section of the schema shares: the modes, the embedded defaults, ``setting``
(a field with its help text and UI hints) and the ``Section`` base."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

MODES = ("lora", "dreambooth", "textual_inversion")
Mode = Literal["lora", "dreambooth", "textual_inversion"]
Widget = Literal["text", "dir", "file", "textarea", "list", "dict", "size"]

EMBEDDED_MODEL = "embedded:tiny-sd15"
EMBEDDED_SDXL = "embedded:tiny-sdxl"
EMBEDDED_FLUX = "embedded:tiny-flux"
EMBEDDED_SD3 = "embedded:tiny-sd3"
# The families the schema names (model.model_version and the GUI's family hints)
FAMILIES = ("sd1", "sd2", "sdxl", "flux1", "sd3")
EMBEDDED_DATASET = "embedded:sample-dataset"


def setting(
    default: Any,
    help: str,
    *,
    label: Optional[str] = None,
    modes: tuple[str, ...] = MODES,
    advanced: bool = False,
    widget: Optional[Widget] = None,
    families: Optional[tuple[str, ...]] = None,
    **bounds: Any,
) -> Any:
    """A schema field: default, bounds (ge/gt/le/lt), help and UI hints (the label people
    read, modes, advanced, widget, and ``families``: the model families that read it, unset
    for all) in one place."""
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
    for family in families or ():
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}")
    ui: dict[str, Any] = {"modes": list(modes), "advanced": advanced}
    if label:
        ui["label"] = label
    if widget:
        ui["widget"] = widget
    if families:
        ui["families"] = list(families)
    return Field(default, description=help, json_schema_extra={"ui": ui}, **bounds)


class Section(BaseModel):
    """Base of every section: unknown keys are errors and assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
