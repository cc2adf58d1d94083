"""Before training: what the dataset holds and how many steps the settings make of it.

``trainer.data.prepare_dataset`` reads the folders and ``trainer.plan.plan_steps`` does the step
arithmetic (images x repeats / batch size / accumulation x epochs), both the very code the run
uses; this module shows their answers, with the bucket table, as markdown.
"""

from __future__ import annotations

from typing import Any

from trainer.config import TrainConfig
from trainer.plan import plan_steps


def bucket_markdown(buckets: dict[str, int]) -> str:
    if not buckets:
        return "_no buckets_"
    rows = ["| bucket (W x H) | images (with repeats) |", "|---|---:|"]
    rows += [f"| {size} | {count} |" for size, count in sorted(
        buckets.items(), key=lambda kv: tuple(int(x) for x in kv[0].lower().split("x")))]
    return "\n".join(rows)


def summary_markdown(cfg: TrainConfig, data: Any, warnings: list[str]) -> str:
    """The arithmetic and the bucket table of prepared training data."""
    tr = cfg.training
    batches = data.steps_per_epoch(tr.train_batch_size)
    try:
        plan = plan_steps(batches, tr.gradient_accumulation_steps, tr.max_train_steps,
                          tr.max_train_epochs)
    except ValueError as exc:
        return f"**The dataset cannot be used:** {exc}"
    lines = [
        f"**{data.num_images} images x repeats = {data.num_repeated} per epoch**; "
        f"batch size {tr.train_batch_size} -> {plan.batches_per_epoch} batches per epoch"
        + (f", accumulating {tr.gradient_accumulation_steps} -> {plan.steps_per_epoch} steps"
           if tr.gradient_accumulation_steps > 1 else ""),
        "",
        f"**{plan.epochs} epoch(s) x {plan.steps_per_epoch} steps = "
        f"{plan.epochs * plan.steps_per_epoch}**"
        + (f", limited by max_train_steps to **{plan.total_steps} steps**"
           if plan.total_steps != plan.epochs * plan.steps_per_epoch else
           f" -> **{plan.total_steps} steps**"),
        "",
        bucket_markdown(data.bucket_table()),
    ]
    if warnings:
        lines += ["", "Warnings:"] + [f"- {w}" for w in warnings]
    return "\n".join(lines)


def check_dataset(cfg: TrainConfig) -> str:
    """Read the dataset of ``cfg`` and describe it; problems come back as a list, not raised."""
    from trainer.data import DatasetError, prepare_dataset

    warnings: list[str] = []
    try:
        data = prepare_dataset(cfg, warn=lambda msg: warnings.append(str(msg)))
    except DatasetError as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        return "**The dataset cannot be used:**\n" + "\n".join(f"- {p}" for p in problems)
    return summary_markdown(cfg, data, warnings)
