"""Captions beyond CLIP's 75 tokens, weighted captions and unpadded ids for the SD families.

sd-scripts' ``--max_token_length 150 | 225`` (library/strategy_base.py ``_get_input_ids``,
strategy_sd.py / strategy_sdxl.py ``encode_tokens``): the caption is tokenized to
``max_token_length + 2`` ids, cut into windows of 75 tokens, each window given its own BOS and a
closing token (EOS for SD 1.x, whose pad is EOS; for SD 2.x and SDXL, EOS after a window whose
last token is text, and a window that starts with padding starts with EOS), the encoder is run
on every window, and the windows' hidden states are put back together: the first window's BOS,
each window's 75 inner states, the last window's closing state (``n x 75 + 2`` states). SDXL's
pooled embedding is the first window's. sd-scripts' SD 2.x fix-up of an empty window compares
an id with the EOS *string* and never fires, so there is none here.

With weighted captions (trainer/families/sd/weighted_prompts.py) each inner state is multiplied by
its token's weight (BOS, EOS and padding keep 1.0), as sd-scripts' ``encode_tokens_with_
weights``. ``no_token_padding`` (sd-scripts' train_db.py, diffusers' DreamBooth) pads a batch
only to its longest caption instead of to 77.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch

WINDOW = 75  # text tokens per window (CLIP's 77 minus BOS and EOS)


@dataclass(frozen=True)
class PromptOptions:
    """How captions become text-encoder input (the [dataset] caption settings)."""

    max_token_length: Optional[int] = None  # text tokens: 150 or 225; None is CLIP's 75
    weighted: bool = False
    no_padding: bool = False

    @classmethod
    def from_config(cls, ds: Any) -> PromptOptions:
        return cls(ds.max_token_length, ds.weighted_captions, ds.no_token_padding)

    @property
    def plain(self) -> bool:
        return self == PromptOptions()


def _windows(tokenizer: Any, ids: torch.Tensor) -> torch.Tensor:
    """Rows of ``n x 75 + 2`` ids -> ``[b, n, 77]`` windows, each with BOS and a closing id."""
    bos, body, last = ids[:, :1], ids[:, 1:-1], ids[:, -1:]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    out = []
    for start in range(0, body.shape[1], WINDOW):
        window = torch.cat([bos, body[:, start : start + WINDOW], last], dim=1)
        if pad != eos:  # SD 2.x / SDXL: close text with EOS, open an empty window with EOS
            text_end = (window[:, -2] != eos) & (window[:, -2] != pad)
            window[text_end, -1] = eos
            window[window[:, 1] == pad, 1] = eos
        out.append(window)
    return torch.stack(out, dim=1)


def token_windows(tokenizer: Any, captions: list[str], opts: PromptOptions
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(ids, weights): ``[b, n, 77]`` windows (or ``[b, L]`` unpadded ids with no_padding), and
    with weighted captions each token's weight, ``[b, n x 75 + 2]`` (the stitched order)."""
    if opts.no_padding:
        ids = tokenizer(captions, padding="longest", truncation=True,
                        max_length=tokenizer.model_max_length, return_tensors="pt").input_ids
        return ids, None
    length = (opts.max_token_length or WINDOW) + 2
    weights = None
    if opts.weighted:
        from trainer.families.sd.weighted_prompts import weighted_ids

        rows = [weighted_ids(tokenizer, caption, length) for caption in captions]
        ids = torch.tensor([r[0] for r in rows])
        weights = torch.tensor([r[1] for r in rows])
    else:
        ids = tokenizer(captions, padding="max_length", truncation=True, max_length=length,
                        return_tensors="pt").input_ids
    return _windows(tokenizer, ids), weights


def stitch(hidden: torch.Tensor, batch: int) -> torch.Tensor:
    """``[b x n, 77, d]`` window states -> ``[b, n x 75 + 2, d]``: the first BOS, each window's
    inner 75, the last window's closing state."""
    hidden = hidden.reshape(batch, -1, hidden.shape[-2], hidden.shape[-1])
    inner = hidden[:, :, 1:-1].reshape(batch, -1, hidden.shape[-1])
    return torch.cat([hidden[:, 0, :1], inner, hidden[:, -1, -1:]], dim=1)


def apply_weights(hidden: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """Each stitched state times its token's weight (1.0 for BOS, EOS and padding)."""
    if weights is None:
        return hidden
    return hidden * weights.unsqueeze(-1).to(hidden.device, hidden.dtype)


def encode_long(tokenizer: Any, captions: list[str], opts: PromptOptions,
                run: Callable[[torch.Tensor], Any]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(hidden, pooled) of ``captions``: ``run(ids)`` encodes ``[rows, tokens]`` ids and returns
    (hidden ``[rows, tokens, d]``, pooled ``[rows, p]`` or None)."""
    ids, weights = token_windows(tokenizer, captions, opts)
    if ids.dim() == 2:  # unpadded: one window of the batch's longest caption
        return run(ids)
    hidden, pooled = run(ids.reshape(-1, ids.shape[-1]))
    hidden = apply_weights(stitch(hidden, len(captions)), weights)
    if pooled is not None:  # SDXL: the first window's pooled embedding, as sd-scripts
        pooled = pooled.reshape(len(captions), -1, pooled.shape[-1])[:, 0]
    return hidden, pooled
