"""ComfyUI's quantized single files read as plain weights: the split files ComfyUI users
download (``*_fp8_scaled``, ``*_fp8_mixed``, ``*_fp8_e4m3fn``) for any family's loader.

ComfyUI stores a quantized Linear's weight in fp8 beside a float32 scale, in two forms
(trainer/families/common/files.py :class:`QuantLayout` reads which, from the header, torch-free):
the legacy "scaled fp8" (a ``scaled_fp8`` marker tensor, ``<layer>.scale_weight``,
``<layer>.scale_input``) and the current "mixed" one (``<layer>.weight_scale``,
``<layer>.input_scale``, ``<layer>.comfy_quant`` JSON or the header's
``_quantization_metadata``). Its weight is ``fp8.to(dtype) * scale`` (``CU-old comfy/ops.py``
``scaled_fp8_op.convert_weight``; the quantizer stores ``fp8(W / scale)`` with
``scale = amax(|W|) / 448``, ``CU comfy/quant_ops.py``). Here the product is taken in float32
(exact: an fp8 value times a float32 scale is one float32 rounding) and then cast to ``dtype``.

:class:`ComfyQuantReader` is a :class:`~trainer.models.streamed_load.SafetensorsReader` whose
entries are the file's weights only (markers and scales dropped, a scaled weight announced in
``dtype``) and whose ``read`` gives each weight dequantized: it drops into
:func:`~trainer.models.streamed_load.load_streamed` as is. :func:`iter_tensors` yields a file's
weights one at a time (the file is never held twice); :func:`load_tensors` gathers a filtered
few into a dict. Weights without a scale (bf16, plain fp8) come as stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

import torch

from trainer.families.common.files import QuantLayout, read_quant_layout
from trainer.models.streamed_load import DTYPES, SafetensorsReader

NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dequantize(weight: torch.Tensor, scale: torch.Tensor,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """ComfyUI's ``weight * scale``, computed in float32, given in ``dtype``."""
    out = weight.to(torch.float32) * scale.to(torch.float32)
    return out if dtype == torch.float32 else out.to(dtype)


class ComfyQuantReader(SafetensorsReader):
    """A file's weights with ComfyUI's scales applied (see the module): ``entries`` holds
    the weights only, ``read(key)`` gives one dequantized to ``dtype`` where it has a scale,
    as stored otherwise. ``layout`` is the file's :class:`QuantLayout` (read when None)."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.bfloat16,
                 layout: Optional[QuantLayout] = None):
        super().__init__(Path(path))
        self.layout = layout if layout is not None else read_quant_layout(path)
        self.dtype = dtype
        self._raw = SafetensorsReader(Path(path))
        self.entries = {k: dict(v, dtype=NAMES[dtype]) if k in self.layout.scales else v
                        for k, v in self._raw.entries.items() if k not in self.layout.dropped}

    def read(self, key: str) -> torch.Tensor:
        scale_key = self.layout.scales.get(key)
        if scale_key is None:
            return self._raw.read(key)
        scale = self._raw.read(scale_key)
        if scale.numel() != 1:
            raise ValueError(f"{self.path}: {scale_key} has {scale.numel()} values; ComfyUI's "
                             "fp8 forms have one scale per weight")
        return dequantize(self._raw.read(key), scale.reshape(()), self.dtype)


def iter_tensors(path: str | Path, dtype: torch.dtype = torch.bfloat16,
                 select: Optional[Callable[[str], bool]] = None,
                 layout: Optional[QuantLayout] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(key, tensor)`` for each weight of the file (``select(key)`` true, when given), in the
    file's order, read one at a time: scaled weights dequantized to ``dtype``, the others as
    stored; the markers and scales are not yielded."""
    reader = ComfyQuantReader(path, dtype, layout)
    for key in list(reader.entries):
        if select is None or select(key):
            yield key, reader.read(key)


def load_tensors(path: str | Path, dtype: torch.dtype = torch.bfloat16,
                 select: Optional[Callable[[str], bool]] = None,
                 layout: Optional[QuantLayout] = None) -> dict[str, torch.Tensor]:
    """:func:`iter_tensors` gathered into a dict: for a small file or a few keys."""
    return dict(iter_tensors(path, dtype, select, layout))
