"""Textual-inversion embeddings as the ecosystem reads them.

SD 1.x/2.x: ``{"emb_params": [n_vectors, dim]}`` (AUTOMATIC1111's safetensors form, which
diffusers' ``load_textual_inversion`` and ComfyUI read); SDXL: ``{"clip_l": [n, 768],
"clip_g": [n, 1280]}``. With a config the file also gets ``modelspec.*`` metadata
(``stable-diffusion-v1/textual-inversion``, as sd-scripts writes it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from trainer.system.safe_write import save_safetensors_atomic


def embedding_tensors(vectors: torch.Tensor, vectors_g: Optional[torch.Tensor] = None, *,
                      dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The tensors of an embedding file; ``vectors_g`` (SDXL's second encoder) selects SDXL."""
    def prep(t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 2:
            raise ValueError(f"embedding vectors must be [n_vectors, dim], got {tuple(t.shape)}")
        return t.detach().to(device="cpu", dtype=dtype).clone().contiguous()

    if vectors_g is None:
        return {"emb_params": prep(vectors)}
    if vectors.shape[0] != vectors_g.shape[0]:
        raise ValueError("clip_l and clip_g need the same number of vectors")
    return {"clip_l": prep(vectors), "clip_g": prep(vectors_g)}


def save_embedding(
    path: str | Path,
    vectors: torch.Tensor,
    *,
    vectors_g: Optional[torch.Tensor] = None,
    cfg: Any = None,
    facts: Any = None,
    dtype: torch.dtype = torch.float32,
    extra: Optional[dict[str, str]] = None,
) -> Path:
    """Write a textual-inversion embedding (safetensors), atomically; ``extra`` adds metadata."""
    tensors = embedding_tensors(vectors, vectors_g, dtype=dtype)
    metadata: dict[str, str] = {}
    if cfg is not None:
        from trainer.export.metadata import RunFacts, modelspec_metadata

        facts = facts or RunFacts(base_model_version="sdxl" if vectors_g is not None else None)
        metadata = modelspec_metadata(cfg, facts, adapter="textual-inversion")
        if cfg.network.token_string:
            metadata["modelspec.trigger_phrase"] = cfg.network.token_string
    metadata.update(extra or {})
    return save_safetensors_atomic(path, tensors, metadata)
