"""[dataset] options of how captions reach the SD families' CLIP text encoders (sd-scripts'):
weighted captions, captions of 150 / 225 tokens, unpadded token ids, and dropping every caption
every N epochs. The encoding is trainer/families/sd/long_prompts.py and weighted_prompts.py; the
dropout trainer/data/captions.py."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import DDPM, Section, setting


class CaptionOptions(Section):
    """The caption options, mixed into :class:`trainer.config.sections.dataset.DatasetSection`."""

    weighted_captions: bool = setting(
        False, "Read '(word:1.2)', '(word)' (x1.1) and '[word]' (/1.1) in captions as weights "
        "of those tokens' text-encoder outputs (sd-scripts' --weighted_captions); '\\(' is a "
        "literal bracket.", advanced=True, families=DDPM, label="Weighted captions",
    )
    max_token_length: Optional[Literal[150, 225]] = setting(
        None, "Captions up to this many tokens instead of CLIP's 75: the text encoder reads "
        "them in windows of 75 with their own start and end tokens, and the outputs are joined "
        "(sd-scripts' --max_token_length). Unset: 75.", advanced=True, families=DDPM,
        label="Caption length (tokens)",
    )
    caption_dropout_every_n_epochs: Optional[int] = setting(
        None, "Train every N-th epoch with empty captions (sd-scripts' "
        "caption_dropout_every_n_epochs).", advanced=True, ge=1, le=10000,
        label="Drop captions every N epochs",
    )
    no_token_padding: bool = setting(
        False, "Pad a batch's token ids only to its longest caption instead of to 77 (sd-scripts' "
        "--no_token_padding, diffusers' DreamBooth); the text-encoder cache is then off.",
        advanced=True, families=DDPM, label="No token padding",
    )
