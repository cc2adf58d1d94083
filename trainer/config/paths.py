"""Where the studio keeps its own files, and how the embedded names resolve.

The data home holds the embedded tiny model, the sample dataset, user presets and the GUI's
temporary files. It is ``$KOHYA_STUDIO_HOME`` when set, else ``data/`` in the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # trainer/config/paths.py -> the checkout


def data_home() -> Path:
    home = os.environ.get("KOHYA_STUDIO_HOME")
    path = Path(home).expanduser() if home else PROJECT_ROOT / "data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def presets_dir() -> Path:
    """The presets that ship with the project (``presets/<mode>/*.toml``)."""
    return PROJECT_ROOT / "presets"


def user_presets_dir() -> Path:
    return data_home() / "presets"
