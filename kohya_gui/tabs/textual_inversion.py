"""The Textual Inversion tab: the token and its initial word come first.

The trainer does not train embeddings yet, so Train reports that clearly (after checking the
settings); presets, config files and Check dataset work as in the other tabs.
"""

from __future__ import annotations

from kohya_gui.runner import Runner
from kohya_gui.tabs.mode_tab import ModeTab, build_mode_tab
from trainer.methods import AVAILABLE_MODES

MODE = "textual_inversion"
SECTIONS = ["", "network", "model", "dataset", "optimizer", "training", "sampling", "saving"]
AVAILABLE = MODE in AVAILABLE_MODES
TITLES = {"network": "Embedding"}


def build(runner: Runner) -> ModeTab:
    return build_mode_tab(MODE, SECTIONS, runner, available=AVAILABLE, titles=TITLES)
