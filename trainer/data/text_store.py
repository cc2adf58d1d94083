"""Text-encoder outputs on disk: one small safetensors file per caption, reused by the next run.

For FLUX.1 and SD 3.5 the text encoders are the slow part of a start (T5-XXL alone is 4.8
billion parameters), and sd-scripts keeps their outputs on disk for the same reason
(``--cache_text_encoder_outputs_to_disk``). A file is named by a hash of the caption and of the
encoders' identity (:func:`encoder_id`: their configs, a sample of their weights, the family's
settings that shape the outputs), so a changed caption, model, T5 length or CLIP skip never
reads a stale file; files are written atomically, so a killed run leaves none half-written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.system.safe_write import save_safetensors_atomic

SAMPLE = 64  # elements read from each weight for the identity: cheap, and any real change shows


def encoder_id(encoders: list[Any], settings: dict[str, Any]) -> str:
    """The identity of the text encoders that make the outputs: each one's config, every
    weight's name, shape, dtype and first elements, and ``settings`` (T5 length, clip skip)."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for encoder in encoders:
        h.update(json.dumps(encoder.config.to_dict(), sort_keys=True, default=str).encode())
        for name, tensor in encoder.state_dict().items():
            h.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
            h.update(tensor.detach().flatten()[:SAMPLE].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def caption_file(folder: Path, identity: str, caption: str) -> Path:
    key = hashlib.sha256(f"{identity}\n{caption}".encode()).hexdigest()[:32]
    return folder / f"te-{key}.safetensors"


def load_row(path: Path) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor], bool]]:
    """(hidden, pooled, masked) from a file written by :func:`save_row`; None if absent or
    unreadable (it is then encoded again and rewritten). ``masked``: the row holds a masked
    caption's real tokens only."""
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        tensors = load_file(str(path))
    except (OSError, ValueError, RuntimeError):
        return None
    if "hidden" not in tensors:
        return None
    return tensors["hidden"], tensors.get("pooled"), "masked" in tensors


def save_row(path: Path, hidden: torch.Tensor, pooled: Optional[torch.Tensor],
             masked: bool = False) -> None:
    tensors = {"hidden": hidden.contiguous()}
    if pooled is not None:
        tensors["pooled"] = pooled.contiguous()
    if masked:
        tensors["masked"] = torch.ones(1, dtype=torch.int8)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors_atomic(path, tensors, {"format": "pt"})
