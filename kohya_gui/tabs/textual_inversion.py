"""The Textual Inversion tab: the token, its initial word and the caption templates come first."""

from __future__ import annotations

from typing import Any

from kohya_gui.runner import Runner
from kohya_gui.tabs.mode_tab import ModeTab, build_mode_tab
from trainer.methods import AVAILABLE_MODES

MODE = "textual_inversion"
SECTIONS = ["network", "model", "dataset", "optimizer", "training", "sampling", "saving"]
AVAILABLE = MODE in AVAILABLE_MODES
TITLES = {"network": "Embedding"}


def build(runner: Runner, controls: bool = True, info: Any = None) -> ModeTab:
    return build_mode_tab(MODE, SECTIONS, runner, available=AVAILABLE, titles=TITLES,
                          controls=controls, info=info)
