"""What the advisor needs of SDXL (:mod:`trainer.advisor.footprint`): the embedded twin's
components and the UNet's text inputs in a step simulated on the meta device (both encoders'
penultimate states, the pooled output and the six size and crop ids)."""

from __future__ import annotations

from typing import Any, Optional

import torch


def tiny_components() -> dict[str, Any]:
    """The embedded twin's components (``embedded:tiny-sdxl``)."""
    from trainer.families.sdxl.tiny import build_sdxl_components

    return build_sdxl_components()


def unet_text_inputs(encoders: list[torch.nn.Module], unet: dict, batch: int,
                     dtype: torch.dtype, length: int, trained: bool
                     ) -> tuple[torch.Tensor, Optional[dict[str, torch.Tensor]]]:
    """(hidden states, added conditions) of ``length`` tokens: through the text encoders
    where one trains (``trained``), else given at the UNet's widths."""
    if trained:
        ids = torch.zeros(batch, length, dtype=torch.long, device="meta")
        outs = [e(ids, output_hidden_states=True) for e in encoders]
        hidden = torch.cat([o.hidden_states[-2] for o in outs], dim=-1)
        pooled = outs[-1][0]
    else:
        hidden = torch.zeros(batch, length, unet["cross_attention_dim"], device="meta",
                             dtype=dtype)
        width = (unet["projection_class_embeddings_input_dim"]
                 - 6 * unet["addition_time_embed_dim"])
        pooled = torch.zeros(batch, width, device="meta", dtype=dtype)
    return hidden, {"text_embeds": pooled,
                    "time_ids": torch.zeros(batch, 6, device="meta", dtype=dtype)}
