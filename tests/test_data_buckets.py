"""Aspect-ratio bucketing: the bucket table, assignment, no-upscale, resize and crop."""

from __future__ import annotations

import random

import pytest

from trainer.data.buckets import (
    BucketSpec,
    assign_bucket,
    bucket_name,
    cover_size,
    crop_box,
    make_buckets,
    nearest_bucket,
    no_upscale_bucket,
    size_problem,
)


def test_make_buckets_respects_area_sides_and_step():
    buckets = make_buckets(512, 256, 1024, 64)
    assert (512, 512) in buckets
    for width, height in buckets:
        assert width * height <= 512 * 512
        assert 256 <= width <= 1024 and 256 <= height <= 1024
        assert width % 64 == 0 and height % 64 == 0
        assert (height, width) in buckets
    assert (384, 640) in buckets and (448, 576) in buckets and (1024, 256) in buckets


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((1000, 1000), (512, 512)),
        ((1000, 1500), (384, 640)),  # 2:3 portrait
        ((1920, 1080), (640, 384)),  # 16:9 landscape
        ((900, 1200), (448, 576)),  # 3:4 portrait
        ((4000, 1000), (1024, 256)),  # 4:1 panorama
    ],
)
def test_images_go_to_the_bucket_of_nearest_aspect_ratio(size, expected):
    assert assign_bucket(size, BucketSpec(512, min_side=256, max_side=1024, step=64)) == expected


def test_nearest_bucket_is_symmetric_for_portrait_and_landscape():
    buckets = make_buckets(512, 256, 1024, 64)
    width, height = nearest_bucket((300, 700), buckets)
    assert nearest_bucket((700, 300), buckets) == (height, width)


def test_bucketing_off_sends_every_image_to_the_square():
    spec = BucketSpec(512, enabled=False)
    assert assign_bucket((1000, 1500), spec) == (512, 512)
    assert assign_bucket((100, 50), spec) == (512, 512)


def test_no_upscale_gives_small_images_their_own_size_rounded_down():
    spec = BucketSpec(512, min_side=256, max_side=1024, step=64, no_upscale=True)
    bucket = assign_bucket((200, 300), spec)
    assert bucket == (192, 256)
    resized = cover_size((200, 300), bucket)
    assert resized[0] <= 200 and resized[1] <= 300  # never enlarged


def test_no_upscale_shrinks_large_images_to_the_area():
    spec = BucketSpec(512, min_side=256, max_side=1024, step=64, no_upscale=True)
    width, height = assign_bucket((2000, 1000), spec)
    assert width * height <= 512 * 512
    assert (width, height) == (704, 320)
    assert no_upscale_bucket((3000, 100), 512 * 512, 1024, 64) == (1024, 64)


def test_cover_size_keeps_aspect_and_covers_the_bucket():
    resized = cover_size((1000, 1500), (384, 640))
    assert resized[0] >= 384 and resized[1] >= 640
    assert abs(resized[0] / resized[1] - 1000 / 1500) < 0.01
    assert min(resized[0] - 384, resized[1] - 640) == 0  # just enough


def test_crop_box_centered_or_random_inside_the_image():
    assert crop_box((400, 640), (384, 640)) == (8, 0, 392, 640)
    boxes = {crop_box((400, 700), (384, 640), random.Random(seed)) for seed in range(20)}
    assert len(boxes) > 1
    for left, top, right, bottom in boxes:
        assert 0 <= left and right <= 400 and 0 <= top and bottom <= 700
        assert (right - left, bottom - top) == (384, 640)


def test_size_problem_rules():
    spec = BucketSpec(512, min_side=256, max_side=1024, step=64)
    assert "min_bucket_reso" in size_problem((100, 200), spec)
    assert size_problem((100, 300), spec) is None  # one side is large enough
    no_up = BucketSpec(512, min_side=256, max_side=1024, step=64, no_upscale=True)
    assert size_problem((100, 200), no_up) is None
    assert "bucket_reso_steps" in size_problem((40, 200), no_up)
    assert size_problem((10, 10), BucketSpec(512, enabled=False)) is None


def test_bucket_name():
    assert bucket_name((512, 768)) == "512x768"
