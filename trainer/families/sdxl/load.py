"""SDXL as the loader reads it: SD's folder and single-file loads (:mod:`trainer.families.sd.load`
tells SDXL by its second text encoder)."""

from trainer.families.sd.load import load_file, load_folder

__all__ = ["load_file", "load_folder"]
