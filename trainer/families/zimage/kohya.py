"""Z-Image's keys in a kohya_ss GUI config: none. kohya_ss has no Z-Image tab and sd-scripts no
Z-Image trainer (musubi-tuner's zimage_train_network.py trains it, from its own options), so no key
picks the family, none is passed with it alone, and a kohya_ss config never names it: the importer's
flow keys apply as for any flow family set by hand (``model.model_version = "zimage"``)."""

from __future__ import annotations

from typing import Any

SWITCHES: dict[str, tuple[str, ...]] = {}  # no kohya_ss key picks Z-Image
LORA_TYPES: tuple[str, ...] = ()
RULES: dict[str, Any] = {}
ENCODER_FILES: dict[str, tuple[str, ...]] = {}
UNSUPPORTED: dict[str, str] = {}
NOT_NEEDED: dict[str, str] = {}
ONLY: tuple[str, ...] = ()
TIMESTEP_RANGE = False  # no sd-scripts trainer of its own reads min / max_timestep


def finish(ctx: Any) -> None:
    """Nothing: no trainer of kohya_ss's implies an objective for Z-Image."""
