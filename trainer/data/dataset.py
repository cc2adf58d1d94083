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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.config.paths import data_home as studio_data_home
from trainer.families.sdxl.conditioning import size_ids

from . import color_aug
from .buckets import BucketSpec, Size, assign_bucket, bucket_name, bucket_table_for, cover_size
from .buckets import crop_box as make_crop_box
from .cache import Encode, LatentJob, LatentStore, build_latent_cache
from .captions import CaptionOptions, apply_caption, full_caption, split_tags
from .control_batch import WithControls
from .controls import ControlSet, control_root, count_problems, data_family, find_controls
from .discover import Candidate, ImageEntry, SubsetOptions, scan_root, validate
from .errors import DatasetError
from .images import load_image, render, to_tensor
from .masks import find_masks, full_mask, render_mask
from .sample import resolve_dataset_dir
from .sampler import count_batches, group_by_bucket, plan_epoch, sample_counts, shard_rows
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
    mask: Optional[torch.Tensor] = None  # [B, 1, H/8, W/8] in 0..1: training.masked_loss
    rows: Optional[tuple[int, int, int]] = None  # a process's share: first, end, global size
    paths: list[Path] = field(default_factory=list)
    # edit training: per reference index, [B, C, h, w] latents when cached, else
    # control_pixels [B, 3, h, w] in [-1, 1] (trainer/data/controls.py); None without controls
    controls: Optional[list[torch.Tensor]] = None
    control_pixels: Optional[list[torch.Tensor]] = None


class TrainingData(WithControls):
    def __init__(self, entries: list[ImageEntry], cfg: Any, train_dir: Path) -> None:
        ds = cfg.dataset
        self.entries = entries
        self.train_dir = train_dir
        self.spec = BucketSpec.from_config(ds)
        self.caption_options = CaptionOptions.from_config(ds)
        self.random_crop = ds.random_crop
        self.flip_aug = ds.flip_aug
        self.color_aug = ds.color_aug  # sd-scripts' colour augmentation (trainer/data/color_aug)
        self.prior_loss_weight = cfg.training.prior_loss_weight
        self.text_cache_blocker = text_cache_blocker(cfg)
        self.templates = templates_for(cfg)  # textual inversion's built-in captions
        self.token = cfg.network.token_string
        # a dataset TOML's per-subset options (None: the dataset section's, above)
        self._options: list[Optional[SubsetOptions]] = [e.folder.options for e in entries]
        specs = [o.spec if o else self.spec for o in self._options]
        tables = {spec: bucket_table_for(spec) for spec in set(specs) if spec.enabled}
        self.buckets: list[Size] = [assign_bucket(e.size, spec, tables.get(spec))
                                    for e, spec in zip(entries, specs)]
        self.counts = _sample_counts(entries, self._options)
        self._groups = group_by_bucket(self.counts, self.buckets)
        self._latents: Optional[LatentStore] = None
        self._text: Optional[TextCache] = None
        self.held_out: list[ImageEntry] = []  # validation images (trainer/data/split.py)
        self.masks: Optional[list] = None  # per entry MaskSource or None (trainer/data/masks.py)
        self.controls: Optional[list[Optional[ControlSet]]] = None  # edit training: use_controls
        self._sizings: list = []

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
        table: dict[str, int] = {}
        for key in sorted(self._groups):  # with controls: (bucket, control sizes)
            name = bucket_name(key[0] if self.controls else key)
            table[name] = table.get(name, 0) + len(self._groups[key])
        return table

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

    def _caption_opts(self, index: int) -> CaptionOptions:
        option = self._options[index]
        return option.caption if option else self.caption_options

    def _flip_aug(self, index: int) -> bool:
        option = self._options[index]
        return option.flip_aug if option else self.flip_aug

    def _color_aug(self, index: int) -> bool:
        option = self._options[index]
        return option.color_aug if option else self.color_aug

    def _random_crop(self, index: int) -> bool:
        option = self._options[index]
        return option.random_crop if option else self.random_crop

    def steady(self) -> None:
        """No per-step changes (validation): no flips, no random crops, captions with only their
        prefix and suffix (and keep_tokens_separator, which is no change)."""
        self.flip_aug = self.random_crop = False
        self.caption_options = _steady_caption(self.caption_options)
        self._options = [replace(o, flip_aug=False, random_crop=False,
                                 caption=_steady_caption(o.caption)) if o else None
                         for o in self._options]

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
        lazy: bool = False,
    ) -> int:
        """Encode every image once (``encode``: pixels [B,3,H,W] in [-1,1] on the CPU ->
        latents [B,C,H/8,W/8]); on disk under ``cache_dir`` (default ``<train_data_dir>/.cache``)
        when ``to_disk``. Returns how many images were encoded (0 when the disk cache is valid);
        ``lazy``: how many will be, each when a batch first needs it."""
        if any(self._random_crop(i) for i in range(len(self.entries))):
            raise ValueError(random_crop_conflict())
        colored = next((o.where for o in self._options if o and o.color_aug), None)
        if colored is not None:  # a dataset TOML's subset; dataset.color_aug is refused at load
            raise ValueError(f"color_aug in {colored} of dataset.dataset_config cannot be used "
                             f"with dataset.cache_latents: the colours change at every step and "
                             f"the cache would encode them once; turn one of them off")
        jobs = []
        for index, entry in enumerate(self.entries):
            resized, box = self._geometry(index, None)
            jobs.append(LatentJob(index, entry.path, entry.content_hash, self.buckets[index],
                                  resized, box, self.masks[index] if self.masks else None,
                                  self._control_jobs(index, (resized, box))))
        folder = (Path(cache_dir) if cache_dir else self.default_cache_dir) if to_disk else None
        flip = any(self._flip_aug(i) for i in range(len(self.entries)))
        store, encoded = build_latent_cache(jobs, encode, vae_id, flip, folder, batch_size, lazy)
        self._latents = store
        return encoded

    def cached_latent(self, index: int, flipped: bool = False) -> torch.Tensor:
        """The cached latent of image ``index`` (after ``cache_latents``)."""
        if self._latents is None:
            raise RuntimeError("no latent cache: call cache_latents first")
        return self._latents.get(index, flipped)

    def final_captions(self) -> list[str]:
        """The caption of every image as trained, when captions do not change per step."""
        opts = [self._caption_opts(i) for i in range(len(self.entries))]
        if not all(o.is_static for o in opts):
            raise ValueError("captions change per step (shuffle or dropout is on)")
        rng = random.Random(0)
        return [apply_caption(e.caption, o, rng) for e, o in zip(self.entries, opts)]

    def cache_text(self, encode_text: EncodeText, batch_size: int = 16, to_disk: bool = False,
                   cache_dir: Optional[Path] = None, identity: str = "",
                   lazy: bool = False) -> int:
        """Encode each distinct final caption once; returns how many captions were encoded
        (with ``to_disk``, those not found under ``cache_dir``, default
        ``<train_data_dir>/.cache``, for the encoders ``identity``; ``lazy``: how many will be,
        each when a batch first needs it).

        Raises ``ValueError`` when the configuration does not allow it (see
        ``text_cache_blocker``)."""
        if self.text_cache_blocker:
            raise ValueError(f"text-encoder outputs cannot be cached: {self.text_cache_blocker}")
        folder = (Path(cache_dir) if cache_dir else self.default_cache_dir) if to_disk else None
        keys, encode, batch_size = self._text_jobs(self.final_captions(), encode_text,
                                                   batch_size)
        self._text = TextCache.build(keys, encode, batch_size, folder, identity, lazy)
        return self._text.encoded

    def epoch(self, epoch: int, batch_size: int, seed: int, skip: int = 0,
              shard: Optional[tuple[int, int]] = None) -> Iterator[Batch]:
        """The batches of ``epoch``; their number is ``steps_per_epoch(batch_size)``. ``skip``
        leaves out the first batches (a resumed run): the rest are exactly as they would be.
        ``shard`` = (rank, processes): the epoch of the global batch ``batch_size x processes``,
        of which this process gets its rows (sampler.shard_rows; trainer/system/distributed.py)."""
        rank, world = shard or (0, 1)
        for step, indices in enumerate(plan_epoch(self._groups, batch_size * world, seed, epoch)):
            if step >= skip:
                rows = shard_rows(len(indices), batch_size, rank) if shard else None
                yield self._batch(indices, random.Random(f"{seed}:{epoch}:{step}"), rows,
                                  epoch)

    def _pixels(self, index: int, flip: bool, geometry: tuple[Size, tuple],
                color: color_aug.Draw = None) -> torch.Tensor:
        rgb = load_image(self.entries[index].path).rgb
        resized, box = geometry
        return to_tensor(color_aug.apply(render(rgb, resized, box, flip), color))

    def _size_ids(self, index: int, geometry: tuple[Size, tuple]) -> list[int]:
        box = geometry[1]
        return size_ids(self.entries[index].size, (box[0], box[1]), self.buckets[index])

    def _batch(self, indices: list[int], rng: random.Random,
               rows: Optional[range] = None, epoch: Optional[int] = None) -> Batch:
        entries = [self.entries[i] for i in indices]
        bases = [template_caption(self.templates, self.token, rng) if self.templates
                 else e.caption for e in entries]
        captions = [apply_caption(c, self._caption_opts(i), rng, epoch)
                    for i, c in zip(indices, bases)]
        flips = [self._flip_aug(i) and rng.random() < 0.5 for i in indices]
        weights = [self.prior_loss_weight if e.is_reg else 1.0 for e in entries]
        geometry = [self._geometry(i, rng if self._random_crop(i) else None) for i in indices]
        colors = [color_aug.draw(rng) if self._color_aug(i) else None for i in indices]
        if rows is not None:  # one process's rows; the draws above were the whole batch's
            size, keep = len(indices), rows or range(1)  # none: a placeholder of weight 0
            indices, entries, captions, flips, geometry, colors = (
                [v[i] for i in keep] for v in (indices, entries, captions, flips, geometry,
                                               colors))
            weights = [weights[i] if rows else 0.0 for i in keep]
        batch = Batch(captions, torch.tensor(weights, dtype=torch.float32),
                      self.buckets[indices[0]], paths=[e.path for e in entries],
                      size_ids=torch.tensor([self._size_ids(i, g)
                                             for i, g in zip(indices, geometry)]))
        if rows is not None:
            batch.rows = (keep.start, keep.stop, size)
        if self._latents is not None and self.masks is not None:
            pairs = [self._latents.get_with_mask(i, f) for i, f in zip(indices, flips)]
            batch.latents = torch.stack([latent for latent, _ in pairs])
            batch.mask = torch.stack([mask for _, mask in pairs])
        elif self._latents is not None:
            batch.latents = torch.stack([self._latents.get(i, f) for i, f in zip(indices, flips)])
        else:
            batch.pixels = torch.stack([self._pixels(i, f, g, c)
                                        for i, f, g, c in zip(indices, flips, geometry, colors)])
        if self.controls:
            self._add_controls(batch, indices, flips, geometry, colors)
        if self._text is not None:
            batch.text = self._text.get([self._text_key(i, c, f)
                                         for i, c, f in zip(indices, captions, flips)])
        if self.masks is not None and batch.mask is None:
            batch.mask = torch.stack([self._mask(i, f, g)
                                      for i, f, g in zip(indices, flips, geometry)])
        return batch

    def _mask(self, index: int, flip: bool, geometry: tuple[Size, tuple]) -> torch.Tensor:
        source = self.masks[index] if self.masks else None
        if source is None:
            return full_mask(self.buckets[index])
        return render_mask(source, geometry[0], geometry[1], flip)


def _steady_caption(opts: CaptionOptions) -> CaptionOptions:
    return CaptionOptions(prefix=opts.prefix, suffix=opts.suffix,
                          keep_tokens_separator=opts.keep_tokens_separator,
                          wildcard="off" if opts.wildcard == "off" else "first")


def _sample_counts(entries: list[ImageEntry], options: list[Optional[SubsetOptions]]
                   ) -> list[int]:
    """``sample_counts`` per dataset of a dataset TOML (sd-scripts matches the regularization
    samples within each dataset); one dataset without a TOML."""
    groups: dict[int, list[int]] = {}
    for index, option in enumerate(options):
        groups.setdefault(option.dataset if option else 0, []).append(index)
    counts = [0] * len(entries)
    for members in groups.values():
        shares = sample_counts([entries[i].repeats for i in members],
                               [entries[i].is_reg for i in members])
        for index, share in zip(members, shares):
            counts[index] = share
    return counts


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
    """Scan and validate the dataset of ``cfg`` (a ``TrainConfig``), edit training's control
    images included (trainer/data/controls.py); raise one :class:`DatasetError` listing every
    problem. ``data_home`` (default: the studio's data home) is where
    ``embedded:sample-dataset`` is generated."""
    ds = cfg.dataset
    problems = _config_problems(cfg)
    found, train_dir = scan_dataset(cfg, warn, problems, data_home)
    if cfg.mode == "textual_inversion" and templates_for(cfg) is None:
        opts = CaptionOptions.from_config(ds)
        missing = captions_without_token(
            [(c.path, full_caption(c.caption, c.folder.options.caption if c.folder.options
                                   else opts)) for c in found], cfg.network.token_string)
        if missing:
            problems.append(token_problem(missing, len(found), cfg.network.token_string))
    entries = validate(found, BucketSpec.from_config(ds), problems)
    entries, held_out = validation_entries(cfg, entries, warn, problems)
    if ds.dataset_config is not None:
        from trainer.data.dataset_toml import subset_masks

        masks = subset_masks(cfg, entries, problems)
    else:
        masks = find_masks(cfg, entries, problems)
    found, held_controls = find_controls(cfg, entries, train_dir, problems, held_out)
    family = data_family(cfg) if found else None
    if family is not None:
        problems += count_problems(found, entries, family)
    if problems:
        raise DatasetError(problems)
    data = TrainingData(entries, cfg, train_dir)
    data.held_out = held_out
    data.masks = masks
    data.use_controls(found, family, ds.control_resolution)
    data.held_out_controls = held_controls
    return data


def scan_dataset(cfg: Any, warn: Callable[[str], None], problems: list[str],
          data_home: Optional[Path]) -> tuple[list[Candidate], Path]:
    """The images of the run (training and regularization) and the folder of the default
    latent cache: the folders of ``dataset.dataset_config``, or of train_data_dir and
    reg_data_dir."""
    ds = cfg.dataset
    if ds.dataset_config is not None:
        from trainer.data.dataset_toml import dataset_candidates

        return dataset_candidates(cfg, warn, problems)
    train_dir = resolve_dataset_dir(ds.train_data_dir, data_home or studio_data_home())
    ignore = frozenset({control_root(ds.control_dir, train_dir).resolve()}) \
        if ds.control_dir is not None else frozenset()  # a control folder kept inside
    found = scan_root(train_dir, "dataset.train_data_dir", ds.caption_extension, False, warn,
                      problems, root_repeats=ds.dataset_repeats, wildcard=ds.enable_wildcard,
                      ignore=ignore)
    if ds.reg_data_dir is not None:  # with num_class_images it may be empty: images come
        found += scan_root(Path(ds.reg_data_dir).expanduser(), "dataset.reg_data_dir",
                           ds.caption_extension, True, warn, problems,
                           required=ds.num_class_images is None, wildcard=ds.enable_wildcard)
    return found, train_dir
