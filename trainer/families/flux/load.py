"""FLUX.1 as the loader reads it: a diffusers folder, or a single file in Black Forest Labs'
layout with its part files (the MMDiT loads of :mod:`trainer.families.common.mmdit_folder`).
Each function returns the fields of :class:`trainer.models.loader.BaseModel`."""

from trainer.families.common.mmdit_folder import load_file, load_folder

__all__ = ["load_file", "load_folder"]
