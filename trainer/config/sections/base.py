"""What every section of the schema shares: the modes, the embedded defaults, ``setting``
(a field with its help text and UI hints) and the ``Section`` base."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from trainer.families import names, spec

SCHEMA_VERSION = 1

MODES = ("lora", "dreambooth", "textual_inversion")
Mode = Literal["lora", "dreambooth", "textual_inversion"]
Widget = Literal["text", "dir", "file", "textarea", "list", "dict", "size"]

EMBEDDED_MODEL = "embedded:tiny-sd15"
EMBEDDED_SDXL = "embedded:tiny-sdxl"
EMBEDDED_FLUX = "embedded:tiny-flux"
EMBEDDED_SD3 = "embedded:tiny-sd3"
# The families the schema names (model.model_version and the ``families`` hints), from the
# registry; the hints name a group by what its families share
FAMILIES = names()
DDPM = names(objective="ddpm")  # the DDPM noise and loss options
FLOW = names(objective="flow")  # the [flow] section
UNET = names(denoiser="unet")  # the UNet's blocks and convolutions
SECOND_CLIP = tuple(n for n in FAMILIES if "clip_g" in spec(n).text_encoders)  # CLIP-G
T5 = tuple(n for n in FAMILIES if "t5xxl" in spec(n).text_encoders)  # T5-XXL (FLUX.1, SD 3.5)
BLOCKS = tuple(n for n in FAMILIES if spec(n).train_blocks)  # network.train_blocks
CLIP_L_FILE = tuple(n for n in FLOW if "clip_l" in spec(n).text_encoders)  # its own file
# the edit models: their spec takes control images (FamilySpec.controls); empty until a family
# declares some, and a hint naming no family shows its setting for none
EDIT = tuple(n for n in FAMILIES if spec(n).controls.max > 0)
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
    for all, empty for none yet) in one place. ``families`` is the only declaration of which
    families read a setting: the GUI hides it for the others, and a config that gives it
    another value than its default for a family outside it is refused
    (:mod:`trainer.config.rules.family`)."""
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
    if families is not None:
        ui["families"] = list(families)
    return Field(default, description=help, json_schema_extra={"ui": ui}, **bounds)


class Section(BaseModel):
    """Base of every section: unknown keys are errors and assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
