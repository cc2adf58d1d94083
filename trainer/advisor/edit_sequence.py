"""Edit training's longer sequences: what the control (reference) images add to a step.

An edit model's transformer reads each control's packed latent tokens after the target's (FLUX.1
Kontext, Qwen-Image-Edit, FLUX.2's references), so a control of the target's size doubles the
image tokens; Qwen-Image-Edit's text encoder reads the controls too (``ControlSpec.text``), and
their vision tokens stay in the text sequence the transformer reads
(``control_text`` of the family's memory role, trainer/families/qwen_image/memory.py).

The controls are counted when the run trains with them: ``dataset.control_dir`` is set, or the
dataset (a dataset TOML's ``control_directory``) pairs its images with controls, and the model
is an edit family's (``FamilySpec.controls.max`` > 0). Which: where the dataset can be read
(the advisor reads it anyway for the step arithmetic: ``trainer.data.prepare_dataset``, cached,
:mod:`trainer.advisor.dataset_cache`), the controls of the training image whose controls make
the most tokens, as many as it has, each sized as the data layer sizes it from its stored size
(:mod:`trainer.data.control_sizing`: the target's bucket, or the family's pipeline area /
preferred sizes, or ``dataset.control_resolution``; a dataset TOML subset's own
``control_resolution`` is not read here), beside a target in the largest bucket (the worst
case); else one control of the target's size (every edit variant's default: Kontext and
Qwen-Image-Edit take one, 2509 / 2511 one unless the data shows more).

A step's tensors depend on how many tokens the sequence holds, not on how they are arranged
(the position ids and rotary tables are as long as the sequence), so the step with controls is
the step at a latent of as many tokens (:func:`sequence_size`): the shipped laws answer for it
as for a larger target, and the simulation runs at that size where there is no law. The loss is
taken on the target's tokens alone; the simulated step's on all of them (the output's few
values per token: negligible).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

PATCH = 16  # pixels a packed token covers (8 x VAE, 2 x 2 patches): every edit family's
DEFAULT_COUNT = 1


@dataclass(frozen=True)
class EditSequence:
    """The controls of a step: their count and trained sizes (pixels), the image tokens they add
    beside the target's, what their reading by the text encoder adds (tokens to the text
    sequence, bytes while encoding, the words of that line), and where the count came from
    ("dataset" or "default")."""

    count: int
    sizes: tuple[tuple[int, int], ...]
    image_tokens: int
    text_tokens: int = 0
    encode_bytes: int = 0
    encode_words: str = ""
    source: str = "default"


def _family(cfg: Any) -> Optional[str]:
    from trainer.data.controls import data_family

    try:
        return data_family(cfg)
    except (OSError, ValueError):
        return None


def dataset_controls(cfg: Any) -> Optional[list[tuple[tuple[int, int], ...]]]:
    """The sizes (width, height, as stored) of each training image's controls in the dataset;
    None where it cannot be read or pairs none."""
    from trainer.advisor.dataset_cache import prepared

    try:
        found = prepared(cfg).controls
    except (OSError, ValueError):  # DatasetError included: the advisor reports it elsewhere
        return None
    out = [tuple(i.size for i in c.images) for c in found or () if c is not None and c.images]
    return out or None


def _sizing(cfg: Any, family: str) -> Any:
    from trainer.data.control_sizing import ControlSizing
    from trainer.families import spec

    sizing = ControlSizing.of_family(spec(family).controls)
    if cfg.dataset.control_resolution is not None:
        sizing = sizing.with_toml(cfg.dataset.control_resolution, False)
    return sizing


def control_sizes(cfg: Any, family: str, bucket: tuple[int, int],
                  stored: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The trained size of each control stored at ``stored`` sizes for a target in
    ``bucket`` (trainer/data/control_sizing.py: the bucket itself where controls take their
    target's; else the family's or control_resolution's size for the control's own)."""
    from trainer.data.control_sizing import own_size

    sizing = _sizing(cfg, family)
    return tuple(tuple(bucket) if sizing.mode == "target" else own_size(tuple(size), sizing)
                 for size in stored)


def _tokens(sizes: tuple[tuple[int, int], ...]) -> int:
    return sum((w // PATCH) * (h // PATCH) for w, h in sizes)


def edit_sequence(cfg: Any, bucket: tuple[int, int], c: int = 2) -> Optional[EditSequence]:
    """What ``cfg``'s controls add to a step at ``bucket``; None without controls (not an edit
    family, no control folder). From the dataset: the training image whose controls make the
    most tokens, beside a target in ``bucket`` (the largest, where the advisor asks); else
    one control of the target's size."""
    from trainer.families import role, spec

    if cfg.dataset.control_dir is None and cfg.dataset.dataset_config is None:
        return None  # no control folder anywhere (a dataset TOML's subsets may name one)
    family = _family(cfg)
    if family is None or spec(family).controls.max == 0:
        return None
    found = dataset_controls(cfg)
    if found is None and cfg.dataset.control_dir is None:
        return None
    stored = found or [(tuple(bucket),) * DEFAULT_COUNT]
    sizes = max((control_sizes(cfg, family, bucket, s[:spec(family).controls.max])
                 for s in stored), key=_tokens)
    text = (0, 0, "")
    own = getattr(role(family, "memory"), "control_text", None)
    if own is not None and spec(family).controls.text:
        text = own(cfg.model, list(sizes), c)
    return EditSequence(len(sizes), sizes, _tokens(sizes), *text,
                        source="dataset" if found else "default")


def sequence_size(size: tuple[int, int], edit: Optional[EditSequence]) -> tuple[int, int]:
    """A latent size (pixels) of as many packed tokens as the target's and the controls':
    ``size`` itself without controls; the target's width and a longer height where the
    controls' tokens fill whole rows (a control of the target's size: twice the height),
    else the sides of that many tokens nearest a square."""
    if edit is None or not edit.image_tokens:
        return size
    across, down = size[0] // PATCH, size[1] // PATCH
    total = across * down + edit.image_tokens
    if total % across == 0:
        return size[0], PATCH * (total // across)
    side = max(d for d in range(1, math.isqrt(total) + 1) if total % d == 0)
    return PATCH * (total // side), PATCH * side
