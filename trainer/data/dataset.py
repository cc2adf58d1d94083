"""The training data of a run: scanned, validated, bucketed, optionally cached, and batched.

``prepare_dataset(cfg, warn)`` checks everything before training starts and raises one
:class:`DatasetError` that lists every problem. The :class:`TrainingData` it returns reports the
bucket table and the steps per epoch, caches latents and text-encoder outputs on request, and
yields the batches of each epoch. All per-step randomness (caption options, flips, random crops)
comes from generators seeded by ``(seed, epoch, step)``, so a run is reproducible.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..models.conditioning import size_ids
from ..paths import data_home as studio_data_home
from .buckets import BucketSpec, Size, assign_bucket, bucket_name, bucket_table_for, cover_size
from .buckets import crop_box as make_crop_box
from .cache import Encode, LatentJob, LatentStore, build_latent_cache
from .captions import CaptionOptions, apply_caption, full_caption, split_tags
from .discover import ImageEntry, scan_root, validate
from .errors import DatasetError
from .images import load_image, render, to_tensor
from .sample import resolve_dataset_dir
from .sampler import count_batches, group_by_bucket, plan_epoch, sample_counts
from .split import validation_entries
from .templates import captions_without_token, template_caption, templates_for, token_problem
from .text_cache import EncodeText, TextCache, text_cache_blocker

CACHE_FOLDER = ".cache"


def random_crop_conflict() -> str:
    return (
        "dataset.random_crop cannot be used with dataset.cache_latents: cached latents hold one "
        "fixed crop per image; turn one of them off"
    )


@dataclass
class Batch:
    """One training batch; every image in it has the size ``bucket`` (width, height)."""

    captions: list[str]
    loss_weights: torch.Tensor  # [B]: 1.0 for training images, prior_loss_weight for reg
    bucket: Size
    latents: Optional[torch.Tensor] = None  # [B, C, H/8, W/8] when latents are cached
    pixels: Optional[torch.Tensor] = None  # [B, 3, H, W] in [-1, 1] otherwise
    text: Any = None  # TextConditioning (hidden, pooled) when the text cache is used
    size_ids: Optional[torch.Tensor] = None  # [B, 6]: SDXL's original size, crop, target size
    paths: list[Path] = field(default_factory=list)


class TrainingData:
    def __init__(self, entries: list[ImageEntry], cfg: Any, train_dir: Path) -> None:
        ds = cfg.dataset
        self.entries = entries
        self.train_dir = train_dir
        self.spec = BucketSpec.from_config(ds)
        self.caption_options = CaptionOptions.from_config(ds)
        self.random_crop = ds.random_crop
        self.flip_aug = ds.flip_aug
        self.prior_loss_weight = cfg.training.prior_loss_weight
        self.text_cache_blocker = text_cache_blocker(cfg)
        self.templates = templates_for(cfg)  # textual inversion's built-in captions
        self.token = cfg.network.token_string
        table = bucket_table_for(self.spec) if self.spec.enabled else None
        self.buckets: list[Size] = [assign_bucket(e.size, self.spec, table) for e in entries]
        self.counts = sample_counts([e.repeats for e in entries], [e.is_reg for e in entries])
        self._groups = group_by_bucket(self.counts, self.buckets)
        self._latents: Optional[LatentStore] = None
        self._text: Optional[TextCache] = None
        self.held_out: list[ImageEntry] = []  # validation images (trainer/data/split.py)

    @property
    def num_images(self) -> int:
        """Distinct images, training and regularization."""
        return len(self.entries)

    @property
    def num_repeated(self) -> int:
        """Samples per epoch: training images x repeats, plus the matched reg samples."""
        return sum(self.counts)

    @property
    def default_cache_dir(self) -> Path:
        return self.train_dir / CACHE_FOLDER

    def bucket_table(self) -> dict[str, int]:
        """``"WxH"`` -> samples per epoch in that bucket (repeats included)."""
        return {bucket_name(b): len(self._groups[b]) for b in sorted(self._groups)}

    def steps_per_epoch(self, batch_size: int) -> int:
        return count_batches([len(g) for g in self._groups.values()], batch_size)

    def tag_frequency(self) -> dict[str, dict[str, int]]:
        """Training folder name -> tag -> images whose caption holds it (``ss_tag_frequency``)."""
        out: dict[str, Counter[str]] = {}
        for entry in self.entries:
            if not entry.is_reg:
                out.setdefault(entry.folder.path.name, Counter()).update(split_tags(entry.caption))
        return {name: dict(tags) for name, tags in out.items()}

    def dataset_dirs(self) -> dict[str, dict[str, int]]:
        """Training folder name -> repeats and image count (``ss_dataset_dirs``)."""
        out: dict[str, dict[str, int]] = {}
        for entry in self.entries:
            if not entry.is_reg:
                info = out.setdefault(entry.folder.path.name, {"n_repeats": entry.repeats,
                                                               "img_count": 0})
                info["img_count"] += 1
        return out

    def _geometry(self, index: int, rng: Optional[random.Random]) -> tuple[Size, tuple]:
        entry, bucket = self.entries[index], self.buckets[index]
        resized = cover_size(entry.size, bucket)
        return resized, make_crop_box(resized, bucket, rng)

    def cache_latents(
        self,
        encode: Encode,
        vae_id: str,
        to_disk: bool,
        cache_dir: Optional[Path] = None,
        batch_size: int = 4,
    ) -> int:
        """Encode every image once (``encode``: pixels [B,3,H,W] in [-1,1] on the CPU ->
        latents [B,C,H/8,W/8]); on disk under ``cache_dir`` (default ``<train_data_dir>/.cache``)
        when ``to_disk``. Returns how many images were encoded (0 when the disk cache is valid)."""
        if self.random_crop:
            raise ValueError(random_crop_conflict())
        jobs = []
        for index, entry in enumerate(self.entries):
            resized, box = self._geometry(index, None)
            jobs.append(LatentJob(index, entry.path, entry.content_hash, self.buckets[index],
                                  resized, box))
        folder = (Path(cache_dir) if cache_dir else self.default_cache_dir) if to_disk else None
        store, encoded = build_latent_cache(jobs, encode, vae_id, self.flip_aug, folder,
                                            batch_size)
        self._latents = store
        return encoded

    def cached_latent(self, index: int, flipped: bool = False) -> torch.Tensor:
        """The cached latent of image ``index`` (after ``cache_latents``)."""
        if self._latents is None:
            raise RuntimeError("no latent cache: call cache_latents first")
        return self._latents.get(index, flipped)

    def final_captions(self) -> list[str]:
        """The caption of every image as trained, when captions do not change per step."""
        if not self.caption_options.is_static:
            raise ValueError("captions change per step (shuffle or dropout is on)")
        rng = random.Random(0)
        return [apply_caption(e.caption, self.caption_options, rng) for e in self.entries]

    def cache_text(self, encode_text: EncodeText, batch_size: int = 16) -> int:
        """Encode each distinct final caption once; returns how many captions were encoded.

        Raises ``ValueError`` when the configuration does not allow it (see
        ``text_cache_blocker``)."""
        if self.text_cache_blocker:
            raise ValueError(f"text-encoder outputs cannot be cached: {self.text_cache_blocker}")
        self._text = TextCache.build(self.final_captions(), encode_text, batch_size)
        return len(self._text)

    def epoch(self, epoch: int, batch_size: int, seed: int, skip: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch``; their number is ``steps_per_epoch(batch_size)``. ``skip``
        leaves out the first batches (a resumed run): the rest are exactly as they would be."""
        for step, indices in enumerate(plan_epoch(self._groups, batch_size, seed, epoch)):
            if step >= skip:
                yield self._batch(indices, random.Random(f"{seed}:{epoch}:{step}"))

    def _pixels(self, index: int, flip: bool, geometry: tuple[Size, tuple]) -> torch.Tensor:
        rgb = load_image(self.entries[index].path).rgb
        resized, box = geometry
        return to_tensor(render(rgb, resized, box, flip))

    def _size_ids(self, index: int, geometry: tuple[Size, tuple]) -> list[int]:
        box = geometry[1]
        return size_ids(self.entries[index].size, (box[0], box[1]), self.buckets[index])

    def _batch(self, indices: list[int], rng: random.Random) -> Batch:
        entries = [self.entries[i] for i in indices]
        bases = [template_caption(self.templates, self.token, rng) if self.templates
                 else e.caption for e in entries]
        captions = [apply_caption(c, self.caption_options, rng) for c in bases]
        flips = [self.flip_aug and rng.random() < 0.5 for _ in indices]
        weights = [self.prior_loss_weight if e.is_reg else 1.0 for e in entries]
        geometry = [self._geometry(i, rng if self.random_crop else None) for i in indices]
        batch = Batch(captions, torch.tensor(weights, dtype=torch.float32),
                      self.buckets[indices[0]], paths=[e.path for e in entries],
                      size_ids=torch.tensor([self._size_ids(i, g)
                                             for i, g in zip(indices, geometry)]))
        if self._latents is not None:
            batch.latents = torch.stack([self._latents.get(i, f) for i, f in zip(indices, flips)])
        else:
            batch.pixels = torch.stack([self._pixels(i, f, g)
                                        for i, f, g in zip(indices, flips, geometry)])
        if self._text is not None:
            batch.text = self._text.get(captions)
        return batch


def _config_problems(cfg: Any) -> list[str]:
    problems = []
    if cfg.dataset.cache_latents and cfg.dataset.random_crop:
        problems.append(random_crop_conflict())
    blocker = text_cache_blocker(cfg)
    if cfg.dataset.cache_text_encoder_outputs and blocker:
        problems.append(f"dataset.cache_text_encoder_outputs is on, but {blocker}")
    return problems


def prepare_dataset(
    cfg: Any, warn: Callable[[str], None], data_home: Optional[Path] = None
) -> TrainingData:
    """Scan and validate the dataset of ``cfg`` (a ``TrainConfig``); raise one
    :class:`DatasetError` listing every problem. ``data_home`` (default: the studio's data home)
    is where ``embedded:sample-dataset`` is generated."""
    ds = cfg.dataset
    problems = _config_problems(cfg)
    train_dir = resolve_dataset_dir(ds.train_data_dir, data_home or studio_data_home())
    found = scan_root(train_dir, "dataset.train_data_dir", ds.caption_extension, False, warn,
                      problems)
    if ds.reg_data_dir is not None:  # with num_class_images it may be empty: images come
        found += scan_root(Path(ds.reg_data_dir).expanduser(), "dataset.reg_data_dir",
                           ds.caption_extension, True, warn, problems,
                           required=ds.num_class_images is None)
    if cfg.mode == "textual_inversion" and templates_for(cfg) is None:
        opts = CaptionOptions.from_config(ds)
        missing = captions_without_token(
            [(c.path, full_caption(c.caption, opts)) for c in found], cfg.network.token_string)
        if missing:
            problems.append(token_problem(missing, len(found), cfg.network.token_string))
    entries = validate(found, BucketSpec.from_config(ds), problems)
    entries, held_out = validation_entries(cfg, entries, warn, problems)
    if problems:
        raise DatasetError(problems)
    data = TrainingData(entries, cfg, train_dir)
    data.held_out = held_out
    return data
