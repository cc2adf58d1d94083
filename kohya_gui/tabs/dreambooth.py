"""The DreamBooth tab: the whole model is trained; its form shows DreamBooth's settings
(prior preservation with generated class images, the text encoder and when it stops training,
diffusers folders for intermediate saves)."""

from __future__ import annotations

from typing import Any

from kohya_gui.runner import Runner
from kohya_gui.tabs.mode_tab import ModeTab, build_mode_tab
from trainer.methods import AVAILABLE_MODES

MODE = "dreambooth"
SECTIONS = ["model", "dataset", "network", "optimizer", "training", "flow", "sampling",
            "saving"]
AVAILABLE = MODE in AVAILABLE_MODES
TITLES = {"network": "What is trained"}


def build(runner: Runner, controls: bool = True, info: Any = None) -> ModeTab:
    return build_mode_tab(MODE, SECTIONS, runner, available=AVAILABLE, titles=TITLES,
                          controls=controls, info=info)
