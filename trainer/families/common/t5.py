"""Prompt tokens and T5-XXL's hidden states as the MMDiT families' pipelines compute them
(diffusers' ``_get_clip_prompt_embeds`` / ``_get_t5_prompt_embeds``)."""

from __future__ import annotations

from typing import Any

import torch

CLIP_LENGTH = 77


def tokens(tokenizer: Any, captions: list[str], length: int, device: Any) -> torch.Tensor:
    return tokenizer(captions, padding="max_length", max_length=length, truncation=True,
                     return_tensors="pt").input_ids.to(device)


def t5_hidden(model: Any, encoder: Any, tokenizer: Any, captions: list[str]) -> torch.Tensor:
    """T5's last hidden states for ``model.t5_max_length`` tokens (diffusers'
    ``_get_t5_prompt_embeds``: padded to the length, no attention mask, as sd-scripts trains
    without ``apply_t5_attn_mask``)."""
    return encoder(tokens(tokenizer, captions, model.t5_max_length, encoder.device))[0]


