"""Caption options applied per step: dropout, tag dropout, shuffle, keep_tokens, prefix/suffix.

Like sd-scripts, a caption is a comma-separated list of tags. The first ``keep_tokens`` tags stay
in place; the others may be dropped (``tag_dropout_rate``, per tag) and shuffled. With
probability ``dropout_rate`` the whole caption becomes empty (unconditional training; prefix and
suffix are dropped too). The prefix and suffix are never shuffled or dropped by tag dropout; they
are joined to the caption with ", ". All randomness comes from the ``random.Random`` the caller
passes, so a seeded run is reproducible.

Two options come from sd-scripts' dataset TOML (its ``process_caption`` in library/train_util.py):
``dropout_every_n_epochs`` empties every caption in each n-th epoch (epochs count from 1), and
``keep_tokens_separator`` (e.g. ``|||``) splits the whole text (prefix, caption and suffix) into a
fixed head, a flexible middle that is shuffled and tag-dropped, and an optional fixed tail;
``keep_tokens`` is then ignored. Unlike sd-scripts the separator never reaches the text encoder,
also when nothing is shuffled.

Wildcards (sd-scripts' ``--enable_wildcard``; ``wildcard = "random"``): a caption file of
several lines is one caption per line, one of which is drawn at each step, and every
``{a|b|c}`` in the caption, prefix or suffix is one of its options, drawn before tags are
shuffled or dropped; ``{{`` and ``}}`` are literal braces. ``wildcard = "first"`` (validation)
takes the first line and the first option of each, the same at every step.
"""

from __future__ import annotations

import dataclasses
import random
import re
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
    keep_tokens_separator: Optional[str] = None
    dropout_every_n_epochs: Optional[int] = None
    wildcard: str = "off"  # "off", "random" (a choice per step) or "first" (the same each step)

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
            dropout_every_n_epochs=getattr(ds, "caption_dropout_every_n_epochs", None),
            wildcard="random" if getattr(ds, "enable_wildcard", False) else "off",
        )

    @property
    def is_static(self) -> bool:
        """True when a caption comes out the same at every step (no shuffle, no dropout)."""
        return (not self.shuffle and self.dropout_rate == 0 and self.tag_dropout_rate == 0
                and not self.dropout_every_n_epochs and self.wildcard != "random")


def split_tags(caption: str) -> list[str]:
    """The comma-separated tags of a caption, stripped, empty ones removed."""
    return [tag.strip() for tag in caption.split(",") if tag.strip()]


def _join(parts: list[Optional[str]]) -> str:
    return ", ".join(p.strip() for p in parts if p and p.strip())


def full_caption(caption: str, opts: CaptionOptions) -> str:
    """The caption with the prefix and suffix, before any per-step change."""
    return _join([opts.prefix, caption, opts.suffix])


def _flexible(tags: list[str], opts: CaptionOptions, rng: random.Random) -> list[str]:
    if opts.tag_dropout_rate > 0:
        tags = [t for t in tags if rng.random() >= opts.tag_dropout_rate]
    if opts.shuffle:
        rng.shuffle(tags)
    return tags


def _separated(text: str, opts: CaptionOptions, rng: random.Random) -> str:
    """``head SEP middle [SEP tail]``: only the middle's tags are dropped and shuffled."""
    head, _, rest = text.partition(opts.keep_tokens_separator or "")
    middle, _, tail = rest.partition(opts.keep_tokens_separator or "")
    tags = split_tags(head) + _flexible(split_tags(middle), opts, rng) + split_tags(tail)
    return ", ".join(tags)


_OPEN, _CLOSE = "\x00", "\x01"  # stand-ins for {{ and }} while the options are drawn
_OPTIONS = re.compile(r"\{([^}]+)\}")


def expand_wildcards(text: Optional[str], rng: Optional[random.Random]) -> Optional[str]:
    """One line of ``text`` and one option of each ``{a|b|c}``, drawn with ``rng`` (the first
    of each when ``rng`` is None); ``{{`` / ``}}`` become literal braces."""
    if not text:
        return text
    lines = [line for line in text.split("\n") if line.strip()] or [text]
    text = lines[0] if rng is None else rng.choice(lines)
    text = text.replace("{{", _OPEN).replace("}}", _CLOSE)
    text = _OPTIONS.sub(lambda m: (m.group(1).split("|")[0] if rng is None
                                   else rng.choice(m.group(1).split("|"))), text)
    return text.replace(_OPEN, "{").replace(_CLOSE, "}")


def apply_caption(caption: str, opts: CaptionOptions, rng: random.Random,
                  epoch: Optional[int] = None) -> str:
    """The caption as trained at this step (of ``epoch``, counted from 1, when given)."""
    if opts.dropout_rate > 0 and rng.random() < opts.dropout_rate:
        return ""
    if opts.dropout_every_n_epochs and epoch is not None \
            and epoch % opts.dropout_every_n_epochs == 0:
        return ""
    if opts.wildcard != "off":
        draw = rng if opts.wildcard == "random" else None
        caption = expand_wildcards(caption, draw) or ""
        opts = dataclasses.replace(opts, prefix=expand_wildcards(opts.prefix, draw),
                                   suffix=expand_wildcards(opts.suffix, draw))
    sep = opts.keep_tokens_separator
    if sep and sep in (whole := _join([opts.prefix, caption, opts.suffix])):
        return _separated(whole, opts, rng)
    if opts.shuffle or opts.tag_dropout_rate > 0:
        tags = split_tags(caption)
        fixed, flexible = tags[: opts.keep_tokens], tags[opts.keep_tokens :]
        caption = ", ".join(fixed + _flexible(flexible, opts, rng))
    return _join([opts.prefix, caption, opts.suffix])
