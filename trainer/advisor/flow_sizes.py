"""FLUX.1 / SD 3.5 sizes at the run's settings: the frozen weights at the compute width (bf16 or
fp32) and the step's activations at the configured T5 length.

:mod:`trainer.advisor.flow_memory` counts and simulates at bf16 and at the family's T5 length
(FLUX.1-dev 512 tokens, SD 3.5 256): its laws are made that way and shipped
(:mod:`trainer.advisor.shipped`). A run on the CPU in fp32, or with
``model.t5xxl_max_token_length = 128``, holds other sizes; this module answers for them from
the same counts and the same small models.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch

from trainer.advisor import flow_memory as fm
from trainer.advisor.model_configs import cached


def text_tokens(config: dict, cfg: Any = None, edit: Any = None) -> int:
    """The text tokens beside the image's in a step: T5's configured length
    (``model.t5xxl_max_token_length``, else the family's), SD 3.5's 77 CLIP tokens, and what
    an edit model's text encoder adds reading the controls (``edit``: Qwen-Image-Edit's vision
    tokens, :mod:`trainer.advisor.edit_sequence`)."""
    t5 = getattr(getattr(cfg, "model", None), "t5xxl_max_token_length", None)
    own = edit.text_tokens if edit is not None else 0
    return (t5 or fm.t5_tokens(config)) + fm.clip_tokens(config) + own


def unit_bytes(w: fm.FlowWeights, base: str, c: int = 2) -> list[float]:
    """Bytes of each swap unit's frozen weights for a base precision, ``c`` bytes a weight
    where it is kept in the compute precision (2: bf16; 4: fp32)."""
    out = []
    for n, cast, quant in zip(w.units, w.fp8_units, w.quant_units):
        if base == "fp8":
            out.append(c * (n - cast) + cast)
        elif base in ("nf4", "int8"):
            out.append(c * (n - quant) + (fm.NF4_BYTES if base == "nf4" else fm.INT8_BYTES)
                       * quant)
        else:
            out.append(c * n)
    return out


def weight_bytes(w: fm.FlowWeights, base: str, swap: Optional[int], c: int = 2) -> int:
    """:func:`trainer.advisor.flow_memory.weight_bytes` at ``c`` bytes a compute-precision
    weight: the device's bytes (the swapped blocks but the two in flight are on the host)."""
    units = unit_bytes(w, base, c)
    other = w.total - sum(w.units)
    total = c * other - ((c - 1) * w.fp8_other if base == "fp8" else 0)
    swapped = range(len(units) - (swap or 0), len(units))
    resident = [units[i] for i in range(len(units)) if i not in swapped]
    in_flight = sorted((units[i] for i in swapped), reverse=True)[:2]
    return int(total + sum(resident) + sum(in_flight))


class _TextLength(torch.nn.Module):
    """A transformer called with ``text`` text tokens, whatever the inputs it is given hold."""

    def __init__(self, inner: torch.nn.Module, text: int):
        super().__init__()
        self.inner, self.text = inner, text

    def enable_gradient_checkpointing(self, func: Any) -> None:
        self.inner.enable_gradient_checkpointing(func)

    def forward(self, **inputs: Any) -> Any:
        batch, _, width = inputs["encoder_hidden_states"].shape
        inputs["encoder_hidden_states"] = torch.zeros(batch, self.text, width, device="meta",
                                                      dtype=torch.bfloat16)
        if "txt_ids" in inputs:  # [text, 3] (FLUX.1) or [batch, text, 4] (FLUX.2)
            ids = list(inputs["txt_ids"].shape)
            ids[-2] = self.text
            inputs["txt_ids"] = torch.zeros(ids, device="meta")
        return self.inner(**inputs)


def step_bytes(config: dict, cfg: Any, size: tuple[int, int], batch: int,
               checkpointing: bool) -> int:
    """Peak bytes of a LoRA step's own tensors (bf16) at T5's configured length: the shipped
    laws' answer at the family's length (:func:`trainer.advisor.flow_memory.
    simulate_flow_step`), else the same small models simulated at this one, extrapolated per
    block; cached. With controls (:func:`trainer.advisor.edit_sequence.edit_sequence`), at a
    latent of as many tokens as the target's and the controls' together, and with the text
    tokens their reading adds."""
    from trainer.advisor.edit_sequence import edit_sequence, sequence_size

    edit = edit_sequence(cfg, size)
    size = sequence_size(size, edit)
    text = text_tokens(config, cfg, edit)
    if text == text_tokens(config):
        return fm.simulate_flow_step(config, cfg, size, batch, checkpointing)

    def build() -> int:
        peaks = [fm._simulate(_TextLength(fm._small_model(config, blocks, cfg), text), config,
                              size, batch, checkpointing) for blocks in fm._shapes(config)]
        fixed, first, second = fm._extrapolate(config, peaks)
        doubles, singles = fm._block_counts(config)
        return int(fixed + doubles * first + singles * second)
    key = json.dumps(["flow-step-text", config, cfg.network.model_dump(mode="json"), list(size),
                      batch, checkpointing, text], sort_keys=True)
    return cached(key, build)
