"""Before training: what the dataset holds and how many steps the settings make of it.

``trainer.data.prepare_dataset`` reads the folders and ``trainer.config.plan.plan_steps`` does the
step arithmetic (samples per epoch / batch size / accumulation x epochs), both the very code the run
uses; this module shows their answers, with the bucket table, as markdown.

Regularization images add as many samples per epoch as the training images give (sd-scripts'
rule, ``trainer.data.sampler``), shuffled into the same batches. When ``num_class_images`` asks
for class images the folder does not hold yet, the run generates them first (squares of
``dataset.resolution``) and reads the folders again; the check adds them where that second scan
will find them, so the numbers shown are the run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kohya_gui.safe_text import md, md_lines
from trainer.config import TrainConfig
from trainer.config.plan import plan_steps


@dataclass(frozen=True)
class ClassImages:
    """The class images that the run will generate before training."""

    folder: Path
    prompt: str
    indices: list[int]


def bucket_markdown(buckets: dict[str, int]) -> str:
    if not buckets:
        return "_no buckets_"
    rows = ["| bucket (W x H) | samples per epoch (repeats and reg included) |", "|---|---:|"]
    rows += [f"| {size} | {count} |" for size, count in sorted(
        buckets.items(), key=lambda kv: tuple(int(x) for x in kv[0].lower().split("x")))]
    return "\n".join(rows)


def samples_line(data: Any, batch_size: int, generated: int = 0) -> str:
    """Images x repeats, and the regularization samples interleaved with them."""
    reg = [i for i, e in enumerate(data.entries) if e.is_reg]
    train_images = len(data.entries) - len(reg)
    reg_samples = sum(data.counts[i] for i in reg)
    train_samples = data.num_repeated - reg_samples
    line = f"**{train_images} training images x repeats = {train_samples} samples per epoch**"
    if reg:
        made = f", {generated} of them generated before training" if generated else ""
        line += (f", plus **{reg_samples} regularization samples** from {len(reg)} "
                 f"regularization image(s){made}, interleaved with the training images in the "
                 f"batches: as many as the training samples (as sd-scripts does), so an epoch "
                 f"has twice the samples and about twice the steps -> **{data.num_repeated} "
                 f"samples per epoch**")
    return line + f"; batch size {batch_size}"


def generation_line(cfg: TrainConfig, todo: ClassImages | None, have: int) -> str:
    """What prior preservation's class-image generation will do before training."""
    from trainer.config.sections.resolution import base_size

    width, height = base_size(cfg.dataset.resolution)
    wanted = cfg.dataset.num_class_images
    if todo is None:
        return (f"The class folder holds {have} image(s) (dataset.num_class_images = {wanted}): "
                f"none to generate.")
    return (f"**{len(todo.indices)} class image(s) will be generated before training** into "
            f"{md(todo.folder)} ({have} there now, dataset.num_class_images = {wanted}), "
            f"{width}x{height} each, prompt '{md(todo.prompt)}'; the numbers below count them.")


def summary_markdown(cfg: TrainConfig, data: Any, warnings: list[str],
                     preface: list[str] | None = None, generated: int = 0) -> str:
    """The arithmetic and the bucket table of prepared training data."""
    tr = cfg.training
    batches = data.steps_per_epoch(tr.train_batch_size)
    try:
        plan = plan_steps(batches, tr.gradient_accumulation_steps, tr.max_train_steps,
                          tr.max_train_epochs)
    except ValueError as exc:
        return f"**The dataset cannot be used:** {md(exc, 2_000)}"
    per_epoch = plan.epochs * plan.steps_per_epoch
    lines = list(preface or []) + [
        samples_line(data, tr.train_batch_size, generated)
        + f" -> {plan.batches_per_epoch} batches per epoch"
        + (f", accumulating {tr.gradient_accumulation_steps} -> {plan.steps_per_epoch} steps"
           if tr.gradient_accumulation_steps > 1 else ""),
        "",
        f"**{plan.epochs} epoch(s) x {plan.steps_per_epoch} steps = {per_epoch}**"
        + (f", limited by max_train_steps to **{plan.total_steps} steps**"
           if plan.total_steps != per_epoch else f" -> **{plan.total_steps} steps**"),
        "",
        bucket_markdown(data.bucket_table()),
    ]
    if warnings:
        shown = warnings[:50] + ([f"... and {len(warnings) - 50} more"]
                                 if len(warnings) > 50 else [])
        lines += ["", "Warnings:", md_lines(shown, 500)]
    return "\n".join(lines)


def class_images_to_generate(cfg: TrainConfig) -> tuple[ClassImages | None, int]:
    """(what the run will generate or None, images the class folder holds now).
    Raises ``trainer.run.class_images.ClassImageError`` when the class folder is ambiguous."""
    from trainer.data.images import is_image_file
    from trainer.run.class_images import missing_class_images

    folder, prompt, indices = missing_class_images(cfg)
    have = sum(1 for p in folder.iterdir() if is_image_file(p)) if folder.is_dir() else 0
    return (ClassImages(folder, prompt, indices) if indices else None), have


def with_class_images(cfg: TrainConfig, data: Any, todo: ClassImages) -> Any:
    """``data`` as the run's second scan will find it: the generated images added to the
    class folder, in the order the folders and files are read (which decides how the
    regularization samples are shared out)."""
    from trainer.data import TrainingData
    from trainer.data.discover import ConceptFolder, ImageEntry, parse_concept_folder

    repeats, concept = parse_concept_folder(todo.folder.name) or (1, todo.prompt)
    folder = ConceptFolder(todo.folder, repeats, concept)
    from trainer.config.sections.resolution import base_size

    size = base_size(cfg.dataset.resolution)
    new = [ImageEntry(todo.folder / f"class_{i:05d}.png", todo.prompt, folder, True, size, "")
           for i in todo.indices]
    train = [e for e in data.entries if not e.is_reg]
    reg = sorted([e for e in data.entries if e.is_reg] + new,
                 key=lambda e: (e.folder.path, e.path))
    return TrainingData(train + reg, cfg, data.train_dir)


def check_dataset(cfg: TrainConfig) -> str:
    """Read the dataset of ``cfg`` and describe it; problems come back as a list, not raised.
    For an edit model the image pairs follow (kohya_gui/dataset_pairs.py)."""
    from kohya_gui.dataset_pairs import pairs_markdown

    text = describe_dataset(cfg)
    pairs = pairs_markdown(cfg)
    return f"{text}\n\n{pairs}" if pairs else text


def describe_dataset(cfg: TrainConfig) -> str:
    """The counts, the step arithmetic and the buckets, or the problems."""
    from trainer.data import DatasetError, prepare_dataset
    from trainer.run.class_images import ClassImageError

    warnings: list[str] = []
    try:
        data = prepare_dataset(cfg, warn=lambda msg: warnings.append(str(msg)))
        todo, have = (class_images_to_generate(cfg) if cfg.dataset.num_class_images
                      else (None, 0))
    except (DatasetError, ClassImageError) as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        shown = problems[:50] + ([f"... and {len(problems) - 50} more"]
                                 if len(problems) > 50 else [])
        return "**The dataset cannot be used:**\n" + md_lines(shown, 500)
    if cfg.dataset.num_class_images is None:
        return summary_markdown(cfg, data, warnings)
    if todo is not None:
        data = with_class_images(cfg, data, todo)
    return summary_markdown(cfg, data, warnings, [generation_line(cfg, todo, have), ""],
                            generated=len(todo.indices) if todo else 0)
