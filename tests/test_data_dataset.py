"""Batches: one bucket each, every image x repeats per epoch, seeded order, caption options."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainer.config import TrainConfig
from trainer.data import prepare_dataset
from trainer.data.sampler import count_batches, plan_epoch, reg_sample_counts, sample_counts

SIZES = {"sq": (128, 128), "tall": (96, 160), "wide": (160, 96), "wide2": (210, 120)}


def gradient(size: tuple[int, int], shade: int) -> np.ndarray:
    """An image whose every crop and flip differs: ramps along x (red) and y (green)."""
    width, height = size
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    return np.stack([x, y, np.full_like(x, shade * 60)], -1).astype(np.uint8)


def build(tmp_path: Path, repeats: int = 3, **dataset):
    root = tmp_path / "train"
    for index, (name, size) in enumerate(SIZES.items()):
        path = root / f"{repeats}_thing" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(gradient(size, index)).save(path)
        path.with_suffix(".txt").write_text(f"{name}, tag a, tag b, tag c")
    values = dict(train_data_dir=str(root), resolution=128, min_bucket_reso=64,
                  max_bucket_reso=256, bucket_reso_steps=32, cache_latents=False)
    values.update(dataset)
    return prepare_dataset(TrainConfig(dataset=values), lambda _: None, data_home=tmp_path)


def test_bucket_table_counts_repeats(tmp_path):
    data = build(tmp_path)
    assert data.bucket_table() == {"96x160": 3, "128x128": 3, "160x96": 6}
    assert sum(data.bucket_table().values()) == data.num_repeated == 12


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_epoch_batches_one_bucket_each_and_cover_every_sample(tmp_path, batch_size):
    data = build(tmp_path)
    batches = list(data.epoch(0, batch_size, seed=5))
    assert len(batches) == data.steps_per_epoch(batch_size)
    seen: Counter[str] = Counter()
    for batch in batches:
        assert batch.latents is None and batch.pixels is not None
        width, height = batch.bucket
        assert batch.pixels.shape == (len(batch.captions), 3, height, width)
        assert 1 <= len(batch.captions) <= batch_size
        assert -1 <= batch.pixels.min() and batch.pixels.max() <= 1
        assert len({data.buckets[data.entries.index(e)] for e in data.entries
                    if e.path in batch.paths}) == 1
        seen.update(p.name for p in batch.paths)
    assert seen == {"sq.png": 3, "tall.png": 3, "wide.png": 3, "wide2.png": 3}


def test_steps_per_epoch_rounds_up_per_bucket(tmp_path):
    data = build(tmp_path)
    assert data.steps_per_epoch(1) == 12
    assert data.steps_per_epoch(4) == 1 + 1 + 2
    assert data.steps_per_epoch(100) == 3


def test_epoch_order_is_seeded(tmp_path):
    data = build(tmp_path)

    def order(epoch, seed):
        return [tuple(p.name for p in b.paths) for b in data.epoch(epoch, 2, seed)]

    assert order(0, 1) == order(0, 1)
    assert order(0, 1) != order(1, 1)


def test_bucketing_off_sends_everything_to_the_square(tmp_path):
    data = build(tmp_path, enable_bucket=False)
    assert data.bucket_table() == {"128x128": 12}
    assert all(b.pixels.shape[-2:] == (128, 128) for b in data.epoch(0, 4, seed=0))


def test_caption_options_are_applied_per_step_and_reproducibly(tmp_path):
    data = build(tmp_path, shuffle_caption=True, keep_tokens=1, caption_prefix="photo")

    def captions(seed):
        return [c for b in data.epoch(0, 1, seed) for c in b.captions]

    first = captions(3)
    assert first == captions(3)
    assert all(c.startswith("photo, ") for c in first)
    for caption in first:
        tags = caption.split(", ")
        assert tags[1] in SIZES and sorted(tags[2:]) == ["tag a", "tag b", "tag c"]
    assert len(set(first)) > len(SIZES)  # the same image gets different orders


def test_random_crop_varies_the_pixels(tmp_path):
    data = build(tmp_path, random_crop=True, repeats=8)
    crops = {b.pixels[0].numpy().tobytes() for b in data.epoch(0, 1, seed=0)
             if b.paths[0].name == "wide2.png"}
    assert len(crops) > 2
    centered = build(tmp_path / "center", repeats=8)
    crops = {b.pixels[0].numpy().tobytes() for b in centered.epoch(0, 1, seed=0)
             if b.paths[0].name == "wide2.png"}
    assert len(crops) == 1


def test_flip_aug_flips_about_half_of_the_steps(tmp_path):
    data = build(tmp_path, flip_aug=True, repeats=20)
    views = [b.pixels[0] for b in data.epoch(0, 1, seed=0) if b.paths[0].name == "sq.png"]
    plain = [v for v in views if v[0, 0, 0] < 0]  # red ramps up to the right
    flipped = [v for v in views if v[0, 0, 0] > 0]
    assert len(plain) + len(flipped) == 20 and 4 <= len(flipped) <= 16
    assert torch.equal(flipped[0], plain[0].flip(-1))


def test_sampler_functions():
    assert reg_sample_counts([1, 1, 2], 8) == [2, 2, 4]
    assert sum(reg_sample_counts([3, 1, 1], 7)) == 7
    assert reg_sample_counts([1, 1], 0) == [0, 0]
    assert sample_counts([10, 1, 1], [False, True, True]) == [10, 5, 5]
    groups = {(64, 64): [0, 0, 1], (32, 64): [2]}
    batches = plan_epoch(groups, 2, seed=0, epoch=0)
    assert len(batches) == count_batches([3, 1], 2) == 3
    assert sorted(i for b in batches for i in b) == [0, 0, 1, 2]
    assert all(set(b) <= {0, 1} or b == [2] for b in batches)


def test_batches_carry_sdxl_size_ids_from_the_image_bucket_and_crop(tmp_path):
    """(original h, w, crop top, left, target h, w), as diffusers' SDXL pipeline orders them:
    the image's own size, the crop's corner in the resized image, the bucket."""
    from trainer.data.buckets import cover_size, crop_box

    data = build(tmp_path, repeats=1)
    seen = {}
    for batch in data.epoch(1, 1, seed=0):
        entry = next(e for e in data.entries if e.path == batch.paths[0])
        bucket = batch.bucket
        left, top, _, _ = crop_box(cover_size(entry.size, bucket), bucket)
        (width, height), (bw, bh) = entry.size, bucket
        assert batch.size_ids.tolist() == [[height, width, top, left, bh, bw]]
        seen[entry.path.stem] = batch.size_ids[0].tolist()
    assert seen["wide2"][:2] == [120, 210] and seen["wide2"][3] > 0  # cropped at the sides
