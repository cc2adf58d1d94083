"""[saving] settings of sd-scripts (and of OneTrainer / SimpleTuner's EMA) that came with issue 21,
in a module of their own so that outputs.py stays short: which weights the files and samples
hold when an EMA is kept, and the comment and tags of the saved metadata."""

from __future__ import annotations

from typing import Optional

from trainer.config.sections.base import Section, setting


class SavingParity(Section):
    use_ema_weights: bool = setting(
        True, "With training.ema_decay: the saved files and the sample images use the EMA "
        "weights (the training state keeps both); off: the trained weights.", advanced=True,
        label="Save and sample the EMA weights",
    )
    training_comment: Optional[str] = setting(
        None, "A comment written into the saved file's metadata (ss_training_comment, as "
        "sd-scripts' --training_comment).", advanced=True,
        label="Training comment",
    )
    metadata_tags: Optional[str] = setting(
        None, "Comma-separated tags of the model, in the saved file's metadata "
        "(modelspec.tags, as sd-scripts' --metadata_tags).", advanced=True,
        label="Metadata tags",
    )
