"""SD 1.x and 2.x's keys in a kohya_ss GUI config, as the importer (``trainer/importers/kohya/
derived.py``) reads them: ``v2`` picks SD 2.x; without a switch sd-scripts takes SD 1.x (the
import then leaves model_version = auto, read from the model). Every other key of the SD
families is the importer's common table."""

from __future__ import annotations

SWITCHES = {"sd2": ("v2",)}  # family -> the kohya_ss keys that pick it
