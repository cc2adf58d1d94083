"""Which images an epoch trains, and in which batches (pure functions).

Every image appears ``repeats`` times per epoch. When there are regularization images, the
epoch holds as many regularization samples as training samples (as sd-scripts does), shared
among the regularization images in proportion to their folder's repeats. Each batch comes from
one bucket; batches are shuffled with a generator seeded by ``seed + epoch``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from typing import TypeVar

B = TypeVar("B", bound=Hashable)


def reg_sample_counts(reg_repeats: Sequence[int], target: int) -> list[int]:
    """Split ``target`` samples among regularization images in proportion to their repeats.

    Largest-remainder rounding (ties to the earlier image) makes the counts sum to ``target``.
    """
    total = sum(reg_repeats)
    if total == 0 or target <= 0:
        return [0] * len(reg_repeats)
    counts = [target * r // total for r in reg_repeats]
    short = target - sum(counts)
    remainders = [target * r % total for r in reg_repeats]
    by_remainder = sorted(range(len(reg_repeats)), key=lambda i: (-remainders[i], i))
    for i in by_remainder[:short]:
        counts[i] += 1
    return counts


def sample_counts(repeats: Sequence[int], is_reg: Sequence[bool]) -> list[int]:
    """Samples per epoch of each image: its repeats, or its share of the matched reg samples."""
    train_total = sum(r for r, reg in zip(repeats, is_reg) if not reg)
    reg_index = [i for i, reg in enumerate(is_reg) if reg]
    counts = [0 if reg else r for r, reg in zip(repeats, is_reg)]
    shares = reg_sample_counts([repeats[i] for i in reg_index], train_total)
    for i, share in zip(reg_index, shares):
        counts[i] = share
    return counts


def group_by_bucket(counts: Sequence[int], buckets: Sequence[B]) -> dict[B, list[int]]:
    """Image indices per bucket, each index repeated by its count."""
    groups: dict[B, list[int]] = {}
    for index, (count, bucket) in enumerate(zip(counts, buckets)):
        if count > 0:
            groups.setdefault(bucket, []).extend([index] * count)
    return groups


def count_batches(group_sizes: Sequence[int], batch_size: int) -> int:
    """Batches per epoch: every bucket is cut into batches on its own (the last may be short)."""
    return sum(math.ceil(n / batch_size) for n in group_sizes)


def plan_epoch(
    groups: dict[B, list[int]], batch_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """The batches of one epoch: each bucket shuffled and cut, then the batches shuffled."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    rng = random.Random(seed + epoch)
    batches: list[list[int]] = []
    for bucket in sorted(groups):
        items = list(groups[bucket])
        rng.shuffle(items)
        batches.extend(items[i : i + batch_size] for i in range(0, len(items), batch_size))
    rng.shuffle(batches)
    return batches


def shard_rows(size: int, per_process: int, rank: int) -> range:
    """The rows of a global batch of ``size`` that process ``rank`` trains (DDP).

    Process ``r`` takes the block ``r*per_process .. (r+1)*per_process`` (per_process is
    train_batch_size, as in sd-scripts and accelerate), so the processes' shares joined are the
    global batch, in order. A bucket's last global batch may be short: the last processes then
    get a smaller share, or none (an empty range; the caller trains a placeholder with loss
    weight 0 so that every process still takes part in the step).
    """
    start = min(rank * per_process, size)
    return range(start, min(start + per_process, size))
