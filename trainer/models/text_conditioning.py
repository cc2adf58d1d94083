"""The text side of a batch's conditioning, the record every family's ``encode`` returns and the
text cache stores: hidden states for the denoiser's cross-attention (or joint attention), and a
pooled embedding for the families that read one (SDXL, FLUX.1, SD 3.5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class TextConditioning:
    """The text side of the conditioning of a batch (or of one caption, in the text cache)."""

    hidden: torch.Tensor  # [B, L, D]: encoder_hidden_states
    pooled: Optional[torch.Tensor] = None  # [B, P]: the pooled text embedding

    def to(self, device: Any, dtype: torch.dtype) -> TextConditioning:
        pooled = None if self.pooled is None else self.pooled.to(device, dtype)
        return TextConditioning(self.hidden.to(device, dtype), pooled)
