"""A split file read a group of tensors at a time into a meta-built module, in the run's dtype
(ComfyUI's scaled weights dequantized as read, :mod:`trainer.families.common.comfy_quant`), the
weights that fp8 storage keeps arriving in fp8: FLUX.2's and Z-Image's transformers and text
encoders (Qwen3, Mistral-Small-3)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

GROUP_BYTES = 256 * 2**20


def open_reader(path: Path, dtype: torch.dtype) -> Any:
    from trainer.families.common.comfy_quant import ComfyQuantReader

    return ComfyQuantReader(path, dtype)


def _groups(reader: Any, keys: list[str]) -> Any:
    group, size = [], 0
    for key in keys:
        group.append(key)
        size += 4 * math.prod(reader.entries[key]["shape"])
        if size >= GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


def fill_from(module: torch.nn.Module, reader: Any, keys: list[str], strip: str,
              convert: Optional[Callable[[dict], dict]], dtype: torch.dtype, fp8: bool,
              where: str, what: str) -> torch.nn.Module:
    """``module`` (meta-built) filled from ``keys`` of the file, group by group."""
    from diffusers.models.model_loading_utils import load_model_dict_into_meta

    from trainer.families.common.mmdit_parts import fail
    from trainer.models.memory import fp8_storage
    from trainer.models.streamed_load import fill

    storage = fp8_storage(dtype)
    stored = storage.select(module) if fp8 else set()
    wanted = set(module.state_dict())
    try:
        for group in _groups(reader, keys):
            tensors = {k[len(strip):]: reader.read(k) for k in group}
            tensors = convert(tensors) if convert else tensors
            fill(module, {k: v for k, v in tensors.items() if k in wanted}, stored, storage,
                 load_model_dict_into_meta, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - shapes, names
        raise fail(where, what, exc) from None
    return module


def finish(module: torch.nn.Module, dtype: torch.dtype, fp8: bool, where: str, what: str
           ) -> torch.nn.Module:
    from trainer.families.common.mmdit_parts import complete
    from trainer.models.memory import store_fp8, to_compute_dtype

    to_compute_dtype(module, dtype)
    module = complete(module, what, where)
    if fp8:
        store_fp8(module.requires_grad_(False), dtype)
    return module
