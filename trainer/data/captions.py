"""Caption options applied per step: dropout, tag dropout, shuffle, keep_tokens, prefix/suffix.

Like sd-scripts, a caption is a comma-separated list of tags. The first ``keep_tokens`` tags stay
in place; the others may be dropped (``tag_dropout_rate``, per tag) and shuffled. With
probability ``dropout_rate`` the whole caption becomes empty (unconditional training; prefix and
suffix are dropped too). The prefix and suffix are never shuffled or dropped by tag dropout; they
are joined to the caption with ", ". All randomness comes from the ``random.Random`` the caller
passes, so a seeded run is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class CaptionOptions:
    shuffle: bool = False
    keep_tokens: int = 0
    dropout_rate: float = 0.0
    tag_dropout_rate: float = 0.0
    prefix: Optional[str] = None
    suffix: Optional[str] = None

    @classmethod
    def from_config(cls, ds: Any) -> CaptionOptions:
        """From a ``DatasetSection`` (or anything with the same fields)."""
        return cls(
            shuffle=ds.shuffle_caption,
            keep_tokens=ds.keep_tokens,
            dropout_rate=ds.caption_dropout_rate,
            tag_dropout_rate=ds.caption_tag_dropout_rate,
            prefix=ds.caption_prefix,
            suffix=ds.caption_suffix,
        )

    @property
    def is_static(self) -> bool:
        """True when a caption comes out the same at every step (no shuffle, no dropout)."""
        return not self.shuffle and self.dropout_rate == 0 and self.tag_dropout_rate == 0


def split_tags(caption: str) -> list[str]:
    """The comma-separated tags of a caption, stripped, empty ones removed."""
    return [tag.strip() for tag in caption.split(",") if tag.strip()]


def _join(parts: list[Optional[str]]) -> str:
    return ", ".join(p.strip() for p in parts if p and p.strip())


def full_caption(caption: str, opts: CaptionOptions) -> str:
    """The caption with the prefix and suffix, before any per-step change."""
    return _join([opts.prefix, caption, opts.suffix])


def apply_caption(caption: str, opts: CaptionOptions, rng: random.Random) -> str:
    """The caption as trained at this step."""
    if opts.dropout_rate > 0 and rng.random() < opts.dropout_rate:
        return ""
    if opts.shuffle or opts.tag_dropout_rate > 0:
        tags = split_tags(caption)
        fixed, flexible = tags[: opts.keep_tokens], tags[opts.keep_tokens :]
        if opts.tag_dropout_rate > 0:
            flexible = [t for t in flexible if rng.random() >= opts.tag_dropout_rate]
        if opts.shuffle:
            rng.shuffle(flexible)
        caption = ", ".join(fixed + flexible)
    return _join([opts.prefix, caption, opts.suffix])
