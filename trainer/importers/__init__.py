"""Importers: other tools' configs into a validated :class:`~trainer.config.TrainConfig`.

kohya/ reads a kohya_ss GUI JSON config (its form and its presets); see
docs/kohya_ss_import.md for what becomes of each key.
"""
