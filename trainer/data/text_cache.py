"""Cache of text-encoder outputs, keyed by the final caption text.

Only valid when a caption is the same at every step (no shuffle, no caption or tag dropout) and
the text encoder does not change during training (it is frozen and no embedding is trained).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Optional

import torch

EncodeText = Callable[[list[str]], torch.Tensor]


def _reasons(cfg: Any, trains_text_encoder: Optional[bool]) -> list[str]:
    ds, reasons = cfg.dataset, []
    if ds.shuffle_caption:
        reasons.append("dataset.shuffle_caption is on")
    if ds.caption_dropout_rate > 0:
        reasons.append("dataset.caption_dropout_rate is above 0")
    if ds.caption_tag_dropout_rate > 0:
        reasons.append("dataset.caption_tag_dropout_rate is above 0")
    if cfg.mode == "textual_inversion":
        reasons.append("textual_inversion trains token embeddings, so the outputs change")
    elif trains_text_encoder or (trains_text_encoder is None and cfg.network.train_text_encoder):
        reasons.append("network.train_text_encoder is on (the text encoder is trained)")
    return reasons


def text_cache_blocker(cfg: Any) -> Optional[str]:
    """Why the text-encoder outputs of ``cfg`` (a ``TrainConfig``) cannot be cached; None if
    they can."""
    return "; ".join(_reasons(cfg, None)) or None


def text_cache_allowed(cfg: Any, trains_text_encoder: Optional[bool] = None) -> tuple[bool, str]:
    """``(True, "")`` when the outputs can be cached, else ``(False, why)``.

    ``trains_text_encoder`` (the training method's own answer) overrides
    ``network.train_text_encoder`` when given."""
    reasons = _reasons(cfg, trains_text_encoder)
    return (not reasons, "; ".join(reasons))


class TextCache:
    """Text-encoder outputs per caption, kept on the CPU."""

    def __init__(self, embeds: dict[str, torch.Tensor]) -> None:
        self._embeds = embeds

    def __len__(self) -> int:
        return len(self._embeds)

    @classmethod
    def build(
        cls, captions: Iterable[str], encode_text: EncodeText, batch_size: int = 16
    ) -> TextCache:
        unique = sorted(set(captions))
        embeds: dict[str, torch.Tensor] = {}
        for start in range(0, len(unique), batch_size):
            chunk = unique[start : start + batch_size]
            with torch.no_grad():
                out = encode_text(chunk)
            if out.shape[0] != len(chunk):
                raise ValueError(
                    f"encode_text returned {out.shape[0]} outputs for {len(chunk)} captions"
                )
            for caption, row in zip(chunk, out.detach().cpu()):
                embeds[caption] = row.clone()
        return cls(embeds)

    def get(self, captions: list[str]) -> torch.Tensor:
        missing = [c for c in captions if c not in self._embeds]
        if missing:
            raise KeyError(f"captions not in the text cache: {missing}")
        return torch.stack([self._embeds[c] for c in captions])
