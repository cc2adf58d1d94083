"""What every section of the schema shares: the modes, the embedded defaults, ``setting``
(a field with its help text and UI hints) and the ``Section`` base."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

MODES = ("lora", "dreambooth", "textual_inversion")
Mode = Literal["lora", "dreambooth", "textual_inversion"]
Widget = Literal["text", "dir", "file", "textarea", "list", "dict"]

EMBEDDED_MODEL = "embedded:tiny-sd15"
EMBEDDED_SDXL = "embedded:tiny-sdxl"
EMBEDDED_DATASET = "embedded:sample-dataset"


def setting(
    default: Any,
    help: str,
    *,
    label: Optional[str] = None,
    modes: tuple[str, ...] = MODES,
    advanced: bool = False,
    widget: Optional[Widget] = None,
    **bounds: Any,
) -> Any:
    """A schema field: default, bounds (ge/gt/le/lt), help and UI hints (the label people
    read, modes, advanced, widget) in one place."""
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
    ui: dict[str, Any] = {"modes": list(modes), "advanced": advanced}
    if label:
        ui["label"] = label
    if widget:
        ui["widget"] = widget
    return Field(default, description=help, json_schema_extra={"ui": ui}, **bounds)


class Section(BaseModel):
    """Base of every section: unknown keys are errors and assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
