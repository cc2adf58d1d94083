"""The ranks of a LoRA file per UNet block, as sd-scripts' ``networks/lora.py`` counts the blocks
(``get_block_index``; :func:`trainer.config.lora_blocks.block_index`): 25 for SD 1.x / 2.x
(IN00-IN11, M00, OUT00-OUT11), 23 for SDXL (the time / label embedding, IN00-IN08, M00-M02,
OUT00-OUT08, the output layer). Linear and 1x1 layers count for ``block_dims`` /
``block_alphas``, 3x3 convolutions for ``conv_block_dims`` / ``conv_block_alphas``. When every
block has one rank and one alpha, the lists are given in sd-scripts' form too, ready for
[network] ``block_dims`` and the rest (0: no LoRA in that block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from trainer.config.lora_blocks import BLOCK_COUNTS, block_index


@dataclass
class BlockRank:
    index: int  # sd-scripts' block number
    label: str  # IN04, M00, OUT11, ...
    modules: int = 0
    ranks: list[int] = field(default_factory=list)  # distinct ranks, linear and 1x1 layers
    alphas: list[float] = field(default_factory=list)
    conv_ranks: list[int] = field(default_factory=list)  # 3x3 convolutions
    conv_alphas: list[float] = field(default_factory=list)


def block_label(index: int, family: str) -> str:
    """The conventional name of sd-scripts' block ``index`` (as block-weight tools write it):
    the input blocks (IN), the middle (M) and the output blocks (OUT) of the family's counts;
    where sd-scripts counts two more (SDXL), the first is the time / label embedding and the
    last the output layer."""
    side, middle, total = BLOCK_COUNTS[family]
    edge = (total - 2 * side - middle) // 2  # blocks before the input blocks: 0 or 1
    if edge and index == 0:
        return "embeddings"
    if edge and index == total - 1:
        return "out"
    i = index - edge
    if i < side:
        return f"IN{i:02d}"
    return f"M{i - side:02d}" if i < side + middle else f"OUT{i - side - middle:02d}"


def _add(values: list[Any], value: Any) -> None:
    if value is not None and value not in values:
        values.append(value)


def unet_blocks(modules: list[Any], family: str) -> list[BlockRank]:
    """The blocks of the UNet modules (``name``, ``part``, ``rank``, ``alpha``, ``conv`` as
    :class:`trainer.tools.inspect.ModuleStat` has them) that hold any; [] for a family
    without sd-scripts' blocks or a file without UNet modules."""
    if family not in BLOCK_COUNTS:
        return []
    blocks: dict[int, BlockRank] = {}
    for m in modules:
        index = block_index(m.name, family) if m.part == "unet" else -1
        if index < 0:
            continue
        block = blocks.setdefault(index, BlockRank(index, block_label(index, family)))
        block.modules += 1
        _add(block.conv_ranks if m.conv else block.ranks, m.rank)
        _add(block.conv_alphas if m.conv else block.alphas, m.alpha)
    return [blocks[i] for i in sorted(blocks)]


def _one(values: list[Any]) -> Optional[Any]:
    return values[0] if len(values) == 1 else None


def sd_scripts_lists(blocks: list[BlockRank], family: str) -> Optional[dict[str, str]]:
    """``{"block_dims": "0,4,8,...", "block_alphas": ..., "conv_block_dims": ...,
    "conv_block_alphas": ...}`` (conv only when the file has 3x3 modules), or None when a block
    mixes ranks or alphas (a resized file) or a rank is unknown."""
    total = BLOCK_COUNTS[family][2] if family in BLOCK_COUNTS else 0
    if not blocks or not total:
        return None
    by_index = {b.index: b for b in blocks}
    conv = any(b.conv_ranks for b in blocks)
    out: dict[str, list[str]] = {k: [] for k in ("block_dims", "block_alphas")}
    if conv:
        out.update(conv_block_dims=[], conv_block_alphas=[])
    for i in range(total):
        b = by_index.get(i, BlockRank(i, ""))
        pairs = [("block_dims", b.ranks, b.alphas)] + (
            [("conv_block_dims", b.conv_ranks, b.conv_alphas)] if conv else [])
        for key, ranks, alphas in pairs:
            if len(ranks) > 1 or len(alphas) > 1 or (b.modules and ranks and not alphas):
                return None
            rank, alpha = _one(ranks) or 0, _one(alphas)
            alpha_key = key.replace("dims", "alphas")
            out[key].append(str(rank))
            out[alpha_key].append(f"{alpha:g}" if alpha is not None else str(rank or 1))
    return {k: ",".join(v) for k, v in out.items()}


def _values(values: list[Any]) -> str:
    return "/".join(f"{v:g}" for v in sorted(values))


def format_blocks(blocks: list[BlockRank], family: str) -> list[str]:
    """Markdown lines: one per block that has modules, then sd-scripts' lists."""
    if not blocks:
        return []
    lines = ["", f"#### UNet blocks (sd-scripts' {BLOCK_COUNTS[family][2]} blocks)"]
    for b in blocks:
        parts = []
        if b.ranks:
            parts.append(f"rank {_values(b.ranks)}, alpha {_values(b.alphas) or '-'}")
        if b.conv_ranks:
            parts.append(f"conv rank {_values(b.conv_ranks)}, conv alpha "
                         f"{_values(b.conv_alphas) or '-'}")
        lines.append(f"- {b.index} {b.label}: {'; '.join(parts) or 'no rank'} "
                     f"({b.modules} module{'s' * (b.modules != 1)})")
    lists = sd_scripts_lists(blocks, family)
    if lists:
        lines.append("- As [network] settings: " + "; ".join(
            f"{k} = [{v}]" for k, v in lists.items()))
    return lines
