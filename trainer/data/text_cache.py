"""Cache of text-encoder outputs, keyed by the final caption text.

Only valid when a caption is the same at every step (no shuffle, no caption or tag dropout) and
the text encoder does not change during training (it is frozen and no embedding is trained).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.data.text_store import caption_file, load_row, save_row
from trainer.models.text_conditioning import TextConditioning

EncodeText = Callable[[list[str]], Any]  # captions -> TextConditioning (or a hidden tensor)


def _reasons(cfg: Any, trains_text_encoder: Optional[bool]) -> list[str]:
    ds, reasons = cfg.dataset, []
    if ds.shuffle_caption:
        reasons.append("dataset.shuffle_caption is on")
    if ds.caption_dropout_rate > 0:
        reasons.append("dataset.caption_dropout_rate is above 0")
    if ds.caption_tag_dropout_rate > 0:
        reasons.append("dataset.caption_tag_dropout_rate is above 0")
    if ds.caption_dropout_every_n_epochs:
        reasons.append("dataset.caption_dropout_every_n_epochs is set")
    if ds.enable_wildcard:
        reasons.append("dataset.enable_wildcard is on (a line and options drawn per step)")
    if ds.no_token_padding:
        reasons.append("dataset.no_token_padding is on (each batch has its own length)")
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
    """Text-encoder outputs per caption, kept on the CPU: the hidden states, and for SDXL the
    pooled embedding (``encode_text`` returns a TextConditioning).

    A lazy cache (``build(..., lazy=True)``) encodes each of its captions the first time a batch
    asks for it, alone, so that its outputs never depend on which captions shared a call."""

    def __init__(self, rows: dict[str, tuple[torch.Tensor, Optional[torch.Tensor]]]) -> None:
        self._rows = rows
        self.encoded = len(rows)  # how many captions were encoded (not read from disk)
        self._pending: set[str] = set()
        self._encode: Optional[Callable[[list[str]], None]] = None

    def __len__(self) -> int:
        return len(self._rows) + len(self._pending)

    @property
    def pending(self) -> int:
        """Captions of a lazy cache that no batch has asked for yet."""
        return len(self._pending)

    @classmethod
    def build(
        cls, captions: Iterable[str], encode_text: EncodeText, batch_size: int = 16,
        folder: Optional[Path] = None, identity: str = "", lazy: bool = False,
    ) -> TextCache:
        """Encode each distinct caption once; with ``folder``, reuse and keep each caption's
        outputs there (trainer/data/text_store.py; ``identity``: the encoders' id). ``lazy``:
        encode none now (``encoded`` is then how many will be)."""
        rows: dict[str, tuple[torch.Tensor, Optional[torch.Tensor], bool]] = {}
        unique = sorted(set(captions))
        if folder is not None:
            for caption in unique:
                row = load_row(caption_file(folder, identity, caption))
                if row is not None:
                    rows[caption] = row
            unique = [c for c in unique if c not in rows]

        def encode(chunk: list[str]) -> None:
            with torch.no_grad():
                out = _as_conditioning(encode_text(chunk))
            if out.hidden.shape[0] != len(chunk):
                raise ValueError(
                    f"encode_text returned {out.hidden.shape[0]} outputs for {len(chunk)} "
                    f"captions"
                )
            hidden = out.hidden.detach().cpu()
            pooled = None if out.pooled is None else out.pooled.detach().cpu()
            lengths = out.lengths()
            for i, caption in enumerate(chunk):
                # a masked caption keeps its real tokens only (TextConditioning.padded
                # restores the batch's padding)
                row = hidden[i, : lengths[i]] if out.mask is not None else hidden[i]
                rows[caption] = (row.clone(), None if pooled is None else pooled[i].clone(),
                                 out.mask is not None)
                if folder is not None:
                    save_row(caption_file(folder, identity, caption), *rows[caption])

        cache = cls(rows)
        if lazy:
            cache._pending, cache._encode = set(unique), encode
        else:
            for start in range(0, len(unique), batch_size):
                encode(unique[start : start + batch_size])
        cache.encoded = len(unique)
        return cache

    def get(self, captions: list[str]) -> TextConditioning:
        for caption in dict.fromkeys(c for c in captions if c in self._pending):
            self._encode([caption])
            self._pending.discard(caption)  # after: an encode that failed is tried again
        missing = [c for c in captions if c not in self._rows]
        if missing:
            raise KeyError(f"captions not in the text cache: {missing}")
        pooled = [self._rows[c][1] for c in captions]
        pooled = None if pooled[0] is None else torch.stack(pooled)
        if self._rows[captions[0]][2]:
            return TextConditioning.padded([self._rows[c][0] for c in captions], pooled)
        return TextConditioning(torch.stack([self._rows[c][0] for c in captions]), pooled)


def _as_conditioning(out: Any) -> TextConditioning:
    return out if isinstance(out, TextConditioning) else TextConditioning(out)


def text_first_applies(cfg: Any, backend: str, trains_t5: Optional[bool] = None,
                       blocker: Optional[str] = "unknown") -> bool:
    """Whether a run of ``cfg`` on ``backend`` encodes every caption and lets its frozen text
    encoders go before the denoiser is built (trainer/run/text_first.py; the loader decides
    for single files): nothing later needs a text encoder. ``trains_t5``, ``blocker``: the
    method's and the dataset's answers where known (else read from ``cfg``)."""
    import os

    ds, net = cfg.dataset, cfg.network
    if trains_t5 is None:
        trains_t5 = net.train_t5xxl and net.train_text_encoder
    if blocker == "unknown":
        blocker = text_cache_blocker(cfg)
    if cfg.mode != "lora" or trains_t5 or ds.cache_text_encoder_outputs is False or blocker:
        return False
    if not text_cache_allowed(cfg)[0]:  # network.train_text_encoder among the reasons
        return False
    if cfg.sampling.sample_prompts or cfg.sampling.sample_prompts_file:
        return False
    if ds.validation_split or ds.validation_data_dir or ds.num_class_images is not None:
        return False
    if cfg.training.mixed_precision == "auto" and backend == "cpu":
        return False  # auto probes the denoiser on the CPU before it knows the precision
    return int(os.environ.get("WORLD_SIZE", "1")) == 1
