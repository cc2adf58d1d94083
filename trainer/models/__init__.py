"""The model families and how they load: SD 1.x, 2.x and SDXL from a diffusers folder or a single
file (component configs ship as data in ``trainer/assets/families``; detection from the header),
the family objects that turn prompts into conditioning, the tokenizers' offline lookup and the
tiny builders of the embedded models.

May import config and system; never the run.
"""
