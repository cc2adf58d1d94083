"""Captions for textual inversion when the dataset's own captions are not used.

With ``network.caption_templates`` set, every training image gets, at every step, a template
drawn at random with the token put in its place, as the textual-inversion paper (Gal et al.,
"An Image is Worth One Word", 2022) and sd-scripts' ``train_textual_inversion.py`` do: "object"
templates teach a thing, "style" templates a look. Without templates, every caption must hold
the token (:func:`captions_without_token` lists the files that do not).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

OBJECT_TEMPLATES = (
    "a photo of a {}",
    "a picture of a {}",
    "a close-up photo of a {}",
    "a bright photo of a {}",
    "a dark photo of a {}",
    "a cropped photo of a {}",
    "a good photo of a {}",
    "a photo of the {}",
    "a photo of one {}",
    "an image showing a {}",
    "a rendering of a {}",
    "a small {}",
    "a large {}",
    "the {} in a photo",
)

STYLE_TEMPLATES = (
    "a painting in the style of {}",
    "a picture in the style of {}",
    "an illustration in the style of {}",
    "a drawing in the style of {}",
    "a rendering in the style of {}",
    "a photo in the style of {}",
    "artwork in the style of {}",
    "a sketch in the style of {}",
    "a landscape in the style of {}",
    "a portrait in the style of {}",
    "a small image in the style of {}",
    "a large image in the style of {}",
)

TEMPLATES = {"object": OBJECT_TEMPLATES, "style": STYLE_TEMPLATES}


def templates_for(cfg: Any) -> Optional[Sequence[str]]:
    """The templates of a textual-inversion config, or None to train on the captions."""
    if cfg.mode != "textual_inversion" or cfg.network.caption_templates is None:
        return None
    return TEMPLATES[cfg.network.caption_templates]


def template_caption(templates: Sequence[str], token: str, rng: random.Random) -> str:
    return rng.choice(templates).format(token)


def captions_without_token(captions: Sequence[tuple[Path, str]], token: str) -> list[Path]:
    """The images whose full caption (prefix and suffix included) lacks ``token``."""
    return [path for path, caption in captions if token not in caption]


def token_problem(missing: list[Path], total: int, token: str, limit: int = 8) -> str:
    shown = ", ".join(str(p) for p in missing[:limit])
    more = f" and {len(missing) - limit} more" if len(missing) > limit else ""
    return (f"{len(missing)} of {total} image(s) have a caption without network.token_string "
            f"{token!r}, so the token would not learn from them: {shown}{more}. Add the token "
            f"to those captions (or name the concept folder after it), set dataset.caption_prefix "
            f"= {token!r}, or set network.caption_templates = 'object' or 'style'")
