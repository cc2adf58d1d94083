"""The text side of a batch's conditioning, the record every family's ``encode`` returns and the
text cache stores: hidden states for the denoiser's cross-attention (or joint attention), and a
pooled embedding for the families that read one (SDXL, FLUX.1, SD 3.5), and for the families
whose text has a length of its own per caption (the Qwen-encoded ones: Z-Image, Qwen-Image) the
mask of the real tokens: ``hidden`` is then right-padded with zeros to the longest caption of
the batch, and ``mask[i, :n_i]`` is 1 for caption i's ``n_i`` tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class TextConditioning:
    """The text side of the conditioning of a batch (or of one caption, in the text cache)."""

    hidden: torch.Tensor  # [B, L, D]: encoder_hidden_states
    pooled: Optional[torch.Tensor] = None  # [B, P]: the pooled text embedding
    mask: Optional[torch.Tensor] = None  # [B, L] int64: 1 for a real token, 0 for padding

    def to(self, device: Any, dtype: torch.dtype) -> TextConditioning:
        pooled = None if self.pooled is None else self.pooled.to(device, dtype)
        mask = None if self.mask is None else self.mask.to(device)
        return TextConditioning(self.hidden.to(device, dtype), pooled, mask)

    def lengths(self) -> list[int]:
        """Each caption's number of real tokens (all of ``hidden``'s rows without a mask)."""
        if self.mask is None:
            return [self.hidden.shape[1]] * self.hidden.shape[0]
        return [int(n) for n in self.mask.sum(dim=1)]

    def rows(self) -> list[torch.Tensor]:
        """Each caption's hidden states without its padding ([n_i, D] each)."""
        return [h[:n] for h, n in zip(self.hidden, self.lengths())]

    @staticmethod
    def padded(rows: list[torch.Tensor], pooled: Optional[torch.Tensor] = None
               ) -> TextConditioning:
        """Rows of their own lengths as one batch: zeros after each, and the mask."""
        longest = max(r.shape[0] for r in rows)
        hidden = rows[0].new_zeros((len(rows), longest, rows[0].shape[-1]))
        mask = torch.zeros((len(rows), longest), dtype=torch.int64, device=rows[0].device)
        for i, r in enumerate(rows):
            hidden[i, : r.shape[0]] = r
            mask[i, : r.shape[0]] = 1
        return TextConditioning(hidden, pooled, mask)
