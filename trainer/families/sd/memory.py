"""What the advisor needs of SD 1.x / 2.x (:mod:`trainer.advisor.footprint`): the embedded
twin's components and the UNet's text inputs in a step simulated on the meta device."""

from __future__ import annotations

from typing import Any, Optional

import torch


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-sd15``)."""
    from trainer.families.sd.tiny import build_components

    return build_components()


def unet_text_inputs(encoders: list[torch.nn.Module], unet: dict, batch: int,
                     dtype: torch.dtype, length: int, trained: bool
                     ) -> tuple[torch.Tensor, Optional[dict[str, torch.Tensor]]]:
    """(hidden states, added conditions) of ``length`` tokens: through the text encoder where
    it trains (``trained``), else given at the UNet's cross-attention width."""
    if trained:
        ids = torch.zeros(batch, length, dtype=torch.long, device="meta")
        return encoders[0](ids)[0], None
    return torch.zeros(batch, length, unet["cross_attention_dim"], device="meta",
                       dtype=dtype), None
