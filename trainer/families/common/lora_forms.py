"""The peers' forms of a transformer family's LoRA file, read into the family's own form or into
one LoRA per diffusers layer (what ``network.network_weights`` loads).

The peers name the same layers three ways:

- kohya names (``lora_unet_`` + a module path with underscores, ``lora_down`` / ``lora_up`` /
  ``alpha``): on the original layout (sd-scripts' and musubi-tuner's FLUX.2 and Chroma files,
  ComfyUI's native Z-Image names, ours) or on diffusers' layers (musubi-tuner's Z-Image files);
- peft names without alpha (scale 1): ``diffusion_model.`` + a path (ai-toolkit: the original
  layout for FLUX.2 and Chroma, diffusers' for Z-Image and Qwen-Image), ``transformer.`` + the
  diffusers path (diffusers' examples), ``base_model.model.`` + a path.

:func:`kohya_form` renames the peft keys to kohya names with ``alpha = rank`` (the same update);
then every name is ``lora_unet_`` + either an original layer (a *unit*: ``double_blocks_0_
img_attn_qkv``) or one of the diffusers layers a unit fuses (a *part*: ``transformer_blocks_0_
attn_to_q``). A family describes its fused units by :class:`Fused` blocks. :func:`split_units`
gives every part its LoRA (exact: a block-diagonal ``lora_up``, as ours, gives each part its own
rank columns, a dense one, as the peers train the fused layer, the whole ``lora_down`` and its
rows of ``lora_up``); :func:`fuse_parts` writes the parts of a unit as the unit (``lora_down``
stacked, ``lora_up`` block-diagonal, ``alpha`` keeping each part's scale).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

from trainer.families.common.lora_fuse import fuse_factors

UNET = "lora_unet_"
PEFT_PREFIXES = ("diffusion_model.", "transformer.", "base_model.model.")
PEFT_SUFFIXES = {".lora_A.weight": ".lora_down.weight", ".lora_B.weight": ".lora_up.weight"}
DOWN, UP, ALPHA = ".lora_down.weight", ".lora_up.weight", ".alpha"


@dataclass(frozen=True)
class Fused:
    """The fused layers of one kind of block: ``original`` (``double_blocks``) and ``diffusers``
    (``transformer_blocks``) are the blocks' names, ``units`` each fused layer (kohya part of its
    name after the block index) -> its diffusers parts with their rows as multiples of the
    layer's input width (q, k, v of an attention: 1 each; Chroma's linear1: 1, 1, 1, 4)."""

    original: str
    diffusers: str
    units: dict[str, tuple[tuple[str, int], ...]]


def fused_units(table: dict[str, tuple[str, ...]], widths: Optional[dict[str, int]] = None
                ) -> dict[str, tuple[tuple[str, int], ...]]:
    """:class:`Fused` units from a family's table (kohya part -> diffusers modules, dotted):
    the modules' names with underscores, each ``widths`` times the input (default 1)."""
    widths = widths or {}
    return {part: tuple((m.replace(".", "_"), widths.get(m, 1)) for m in modules)
            for part, modules in table.items()}


def kohya_form(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The peft keys as kohya names (``alpha`` = the rank where the file has none); the kohya
    keys as they are."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        prefix = next((p for p in PEFT_PREFIXES if key.startswith(p)), None)
        suffix = next((s for s in PEFT_SUFFIXES if key.endswith(s)), None)
        if prefix is None or (suffix is None and not key.endswith(ALPHA)):
            out[key] = value
            continue
        path = key[len(prefix): -len(suffix or ALPHA)]
        name = UNET + path.replace(".", "_")
        out[name + (PEFT_SUFFIXES[suffix] if suffix else ALPHA)] = value
        if suffix == ".lora_A.weight" and prefix + path + ALPHA not in tensors:
            out[name + ALPHA] = torch.tensor(float(value.shape[0]))
    return out


def _units(blocks: tuple[Fused, ...]):
    """(unit name pattern, diffusers name template, parts) of every fused layer kind."""
    for block in blocks:
        for unit, parts in block.units.items():
            yield (re.compile(rf"^{UNET}{block.original}_(\d+)_{unit}$"),
                   f"{UNET}{block.diffusers}_{{n}}_", parts)


def _scale(tensors: dict[str, torch.Tensor], name: str) -> float:
    alpha = tensors.get(name + ALPHA)
    rank = tensors[name + DOWN].shape[0]
    return (float(alpha) if alpha is not None else rank) / rank


def split_units(tensors: dict[str, torch.Tensor], blocks: tuple[Fused, ...]
                ) -> dict[str, torch.Tensor]:
    """Every fused unit's LoRA as its parts' (kohya names of diffusers' layers); the rest as it
    is. See the module's notes."""
    out = dict(tensors)
    for name in [k[: -len(DOWN)] for k in tensors if k.endswith(DOWN)]:
        for pattern, template, parts in _units(blocks):
            match = pattern.match(name)
            if not match:
                continue
            down, up = out.pop(name + DOWN), out.pop(name + UP)
            scale = _scale(tensors, name)
            out.pop(name + ALPHA, None)
            rows = [down.shape[1] * m for _, m in parts]
            if sum(rows) != up.shape[0]:  # one part, or q, k, v of another width: even shares
                rows = [up.shape[0] // len(parts)] * len(parts)
            cols = _diagonal(up, rows)
            start = 0
            for i, ((part, _), count) in enumerate(zip(parts, rows)):
                keep = cols[i] if cols is not None else slice(None)
                key = template.format(n=match.group(1)) + part
                out[key + DOWN] = down[keep]
                out[key + UP] = up[start:start + count, keep]
                out[key + ALPHA] = torch.tensor(scale * out[key + DOWN].shape[0])
                start += count
            break
    return out


def _diagonal(up: torch.Tensor, rows: list[int]) -> Optional[list[torch.Tensor]]:
    """Each part's rank columns of a block-diagonal ``lora_up``; None for a dense one. Equal
    blocks (our files, ComfyUI's converters) are told even where a column is zero (a part
    saved before it trained)."""
    if len(rows) > 1 and up.shape[1] % len(rows) == 0:
        r, start, own = up.shape[1] // len(rows), 0, []
        for i, count in enumerate(rows):
            block = up[start:start + count]
            if torch.count_nonzero(block) != torch.count_nonzero(block[:, i * r:(i + 1) * r]):
                break
            own.append(torch.arange(i * r, (i + 1) * r))
            start += count
        else:
            return own
    used = torch.zeros(up.shape[1], dtype=torch.bool)
    out, start = [], 0
    for count in rows:
        cols = (up[start:start + count] != 0).any(dim=0)
        if (cols & used).any():
            return None
        used |= cols
        out.append(cols.nonzero().flatten())
        start += count
    return out if len(rows) > 1 and used.all() else None


def fuse_parts(tensors: dict[str, torch.Tensor], blocks: tuple[Fused, ...]
               ) -> dict[str, torch.Tensor]:
    """The parts of every fused unit (kohya names of diffusers' layers) as the unit: ``lora_down``
    stacked, ``lora_up`` block-diagonal (zero rows for a part the file lacks), ``alpha`` the
    parts' common scale x the total rank (a part of another scale has it folded into its
    ``lora_up``); the rest as it is."""
    out = dict(tensors)
    names = {k[: -len(DOWN)] for k in tensors if k.endswith(DOWN)}
    for block in blocks:
        pattern = re.compile(rf"^{UNET}{block.diffusers}_(\d+)_(.+)$")
        found = {(m.group(1)) for n in names if (m := pattern.match(n))}
        for n in sorted(found):
            prefix = f"{UNET}{block.diffusers}_{n}_"
            for unit, parts in block.units.items():
                present = [prefix + p for p, _ in parts if prefix + p in names]
                if not present:
                    continue
                width = tensors[present[0] + DOWN].shape[1]
                rows = [tensors[prefix + p + UP].shape[0] if prefix + p in names else width * m
                        for p, m in parts]
                down, up, alpha = _fuse([(prefix + p if prefix + p in names else None, r)
                                         for (p, _), r in zip(parts, rows)], tensors)
                for name in present:
                    for suffix in (DOWN, UP, ALPHA):
                        out.pop(name + suffix, None)
                key = f"{UNET}{block.original}_{n}_{unit}"
                out.update({key + DOWN: down, key + UP: up, key + ALPHA: alpha})
    return out


def _fuse(parts: list[tuple[Optional[str], int]], tensors: dict[str, torch.Tensor]
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(down, up, alpha) of the kohya-named parts (None: absent) with their rows."""
    factors = [((tensors[n + DOWN], tensors[n + UP], _scale(tensors, n)) if n else None, rows)
               for n, rows in parts]
    down, up, alpha = fuse_factors(factors)
    dtype = next(tensors[n + DOWN].dtype for n, _ in parts if n)
    return down.to(dtype), up.to(dtype), torch.tensor(alpha)
