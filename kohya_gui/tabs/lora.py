"""The LoRA tab: the network section right after the model, as kohya users expect."""

from __future__ import annotations

from typing import Any

from kohya_gui.runner import Runner
from kohya_gui.tabs.mode_tab import ModeTab, build_mode_tab
from trainer.methods import AVAILABLE_MODES

MODE = "lora"
SECTIONS = ["model", "dataset", "network", "optimizer", "training", "flow", "sampling",
            "saving"]
AVAILABLE = MODE in AVAILABLE_MODES


def build(runner: Runner, controls: bool = True, info: Any = None) -> ModeTab:
    return build_mode_tab(MODE, SECTIONS, runner, available=AVAILABLE, controls=controls,
                          info=info)
