"""Edit training's control images, dataset side (issue 33): paired with their targets by stem,
one clear line per bad pair before training, bucketed, cropped and flipped with their target,
carried by the batch per reference index, refused for families that take none; a dataset
without controls batches exactly as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from control_helpers import (
    FAMILY,
    FakeVAE,
    as_edit_family,
    config,
    inverted,
    noise,
    pairs,
    prepare,
)

from trainer.config import TrainConfig
from trainer.config.rules.edit import edit_families, not_edit_message
from trainer.data import DatasetError, prepare_dataset
from trainer.data.control_sizing import ControlSizing, control_geometry, own_size
from trainer.data.controls import pair_by_stem
from trainer.families import FAMILIES, label
from trainer.families.spec import ControlSpec


def test_controls_pair_by_stem_with_numbered_references_in_order():
    files = [Path(f"c/{n}") for n in ("001_1.png", "001.jpg", "001_0000.png", "img_1.png",
                                      "img_2.png", "002_x.png", "zzz.png", "003.png",
                                      "003.webp")]
    paired, orphans, clashes = pair_by_stem({"001", "img", "img_1", "003"}, files)
    # unnumbered first, then by number (4 digits read as numbers too)
    assert [p.name for p in paired["001"]] == ["001.jpg", "001_0000.png", "001_1.png"]
    assert [p.name for p in paired["img_1"]] == ["img_1.png"]  # its whole stem: target img_1's
    assert [p.name for p in paired["img"]] == ["img_2.png"]
    assert [p.name for p in paired["003"]] == ["003.png"]
    assert sorted(p.name for p in orphans) == ["002_x.png", "zzz.png"]
    assert [[p.name for p in group] for group in clashes] == [["003.png", "003.webp"]]


def test_a_kohya_dataset_finds_its_controls_in_order_and_the_concept_subfolder_first(
        tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=3, required=1)
    train = pairs(tmp_path)
    controls = train / "control"
    (controls / "a.png").rename(controls / "a_0.png")
    noise(controls / "a_1.png", (160, 128), 7)
    inverted(train / "3_edit" / "b.png", controls / "3_edit" / "b.png")
    noise(controls / "b.png", (128, 160), 8)  # shadowed by the concept's subfolder
    warnings: list[str] = []
    data = prepare(train, warn=warnings.append)
    assert not warnings  # the control folder inside train_data_dir is no concept folder
    found = {e.path.name: [c.path.relative_to(controls).as_posix() for c in s.images]
             for e, s in zip(data.entries, data.controls)}
    assert found == {"a.png": ["a_0.png", "a_1.png"], "b.png": ["3_edit/b.png"],
                     "c.png": ["c.png"]}


def problems_of(train: Path, **dataset) -> list[str]:
    with pytest.raises(DatasetError) as info:
        prepare(train, **dataset)
    return info.value.problems


def test_a_target_without_the_control_its_family_needs_is_one_line(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=1, required=1)
    train = pairs(tmp_path)
    (train / "control" / "b.png").unlink()
    [line] = problems_of(train)
    assert str(train / "3_edit" / "b.png") in line and "dataset.control_dir" in line
    assert "no control image" in line and f"{label(FAMILY)} needs 1" in line


def test_optional_controls_are_optional(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=2, required=0)
    train = pairs(tmp_path)
    (train / "control" / "b.png").unlink()
    data = prepare(train)
    seen = {}
    for batch in data.epoch(0, 3, seed=0):
        for path in batch.paths:
            seen[path.name] = None if batch.control_pixels is None else \
                len(batch.control_pixels)
    assert seen == {"a.png": 1, "b.png": None, "c.png": 1}


def test_a_control_without_a_target_is_one_line(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=1, required=1)
    train = pairs(tmp_path)
    noise(train / "control" / "zzz_0.png", (64, 64), 3)
    [line] = problems_of(train)
    assert str(train / "control" / "zzz_0.png") in line and "matches no training image" in line


def test_a_control_that_does_not_decode_is_one_line(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=1, required=1)
    train = pairs(tmp_path)
    (train / "control" / "c.png").write_bytes(b"\x89PNG not really")
    [line] = problems_of(train)
    assert str(train / "control" / "c.png") in line and "control image" in line


def test_more_controls_than_the_family_takes_is_one_line(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=1, required=1)
    train = pairs(tmp_path)
    noise(train / "control" / "a_1.png", (160, 128), 5)
    [line] = problems_of(train)
    assert str(train / "3_edit" / "a.png") in line and "takes at most 1" in line
    assert "a.png, a_1.png" in line


def test_two_files_for_one_reference_is_one_line(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=2)
    train = pairs(tmp_path)
    noise(train / "control" / "a.jpg", (160, 128), 5)
    [line] = problems_of(train)
    assert "a.jpg" in line and "a.png" in line and "keep one of them" in line


def test_a_missing_control_folder_is_one_line(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=1)
    train = pairs(tmp_path)
    [line] = problems_of(train, control_dir=str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in line and "does not exist" in line


@pytest.mark.parametrize("cache", [False, True])
def test_controls_share_their_targets_bucket_crop_and_flip(tmp_path, monkeypatch, cache):
    """Each control is its target inverted: rendered with the same resize, crop and flip it is
    exactly minus the target (pixels; with the linear FakeVAE, latents too)."""
    as_edit_family(monkeypatch, max=1, required=1)
    train = pairs(tmp_path)
    crop = dict(random_crop=not cache, flip_aug=True)  # random crops are never cached
    data = prepare(train, enable_bucket=False, **crop)
    if cache:
        data.cache_latents(FakeVAE(), "v", to_disk=False)
    flips = set()
    for epoch in range(4):
        for batch in data.epoch(epoch, 2, seed=1):
            if cache:
                [controls] = batch.controls
                assert batch.control_pixels is None
                assert torch.allclose(controls, -batch.latents, atol=1e-5)
                index = [e.path for e in data.entries].index(batch.paths[0])
                flips.add(torch.equal(batch.latents[0], data.cached_latent(index)))
            else:
                [controls] = batch.control_pixels
                assert controls.shape == batch.pixels.shape  # the target's bucket
                assert torch.allclose(controls, -batch.pixels, atol=1e-6)
    assert not cache or flips == {True, False}  # both the plain and the mirrored latents


def test_control_geometry_follows_the_target_or_the_familys_sizing():
    target = ((160, 128), (20, 0, 148, 128))  # resized 160x128, a crop of 128x128
    bucket = (128, 128)
    same = ControlSizing()
    assert control_geometry((160, 128), same, bucket, target) == (bucket, *target)
    assert control_geometry((320, 256), same, bucket, target) == (bucket, *target)  # 2x
    taller = control_geometry((160, 160), same, bucket, target)  # other aspect: centered
    assert taller == (bucket, (160, 160), (20, 16, 148, 144))
    area = ControlSizing("area", 64 * 64, 16)
    assert own_size((200, 100), area) == (80, 32)  # ~4096 px at 2:1, sides on 16
    assert control_geometry((200, 100), area, bucket, target)[0] == (80, 32)
    native = ControlSizing("native", None, 16)
    assert own_size((200, 100), native) == (192, 96)


def test_a_family_that_sizes_its_controls_batches_them_by_size(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=1, required=1, area=64 * 64, multiple=16)
    train = pairs(tmp_path)
    data = prepare(train)
    for batch in data.epoch(0, 3, seed=0):
        [controls] = batch.control_pixels
        name = batch.paths[0].name
        size = {"a.png": (160, 128), "b.png": (128, 160), "c.png": (128, 128)}[name]
        want = own_size(size, ControlSizing("area", 64 * 64, 16))
        assert controls.shape[-2:] == (want[1], want[0])


def batches(data, epochs=3, batch_size=2):
    return [(b.paths, b.captions, b.pixels, b.bucket, b.controls, b.control_pixels)
            for e in range(epochs) for b in data.epoch(e, batch_size, seed=5)]


def test_a_dataset_without_controls_batches_exactly_as_before(tmp_path, monkeypatch):
    """No control folder: no controls in any batch and the buckets keyed as before; and
    targets whose (optional) controls are absent batch exactly as the plain dataset does."""
    train = pairs(tmp_path)
    plain = prepare(train, control_dir=None, flip_aug=True)
    assert plain.controls is None
    assert all(isinstance(k[0], int) for k in plain._groups)  # keys are the bucket sizes
    as_edit_family(monkeypatch, max=1, required=0)
    for path in (train / "control").iterdir():
        path.unlink()
    empty = prepare(train, flip_aug=True)
    assert [len(s.images) for s in empty.controls] == [0, 0, 0]
    first, second = batches(plain), batches(empty)
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a[:2] == b[:2] and torch.equal(a[2], b[2]) and a[3] == b[3]
        assert a[4:] == b[4:] == (None, None)
    assert plain.bucket_table() == empty.bucket_table()


def test_control_dir_is_refused_for_a_family_that_takes_no_controls():
    takers = edit_families()
    assert {"qwen_image", "flux1_kontext"} <= set(takers)  # Qwen-Image-Edit, FLUX.1 Kontext
    assert takers == tuple(n for n, s in FAMILIES.items() if s.controls.max > 0)
    for family in FAMILIES:
        if family in takers:
            TrainConfig(model={"model_version": family}, dataset={"control_dir": "c"})
            continue
        with pytest.raises(ValueError) as info:
            TrainConfig(model={"model_version": family}, dataset={"control_dir": "c"})
        message = str(info.value)
        assert f"dataset.control_dir is set but {label(family)} is not an edit model" in message
        # each edit family named with the setting that picks it (a single file may not tell)
        assert all(f"{label(n)} (model.model_version = {n!r})" in message for n in takers)


def test_the_refusal_names_the_edit_families_of_the_registry(monkeypatch):
    monkeypatch.setitem(FAMILIES, "sd3", replace(FAMILIES["sd3"], controls=ControlSpec(max=2)))
    message = not_edit_message("dataset.control_dir", FAMILY)
    assert f"{label('sd3')} (model.model_version = 'sd3')" in message and label(FAMILY) in message
    for name in list(FAMILIES):
        monkeypatch.setitem(FAMILIES, name, replace(FAMILIES[name], controls=ControlSpec()))
    assert "none of the model families here takes control images yet" in \
        not_edit_message("dataset.control_dir", FAMILY)


def test_controls_found_with_a_loaded_family_that_takes_none_are_refused(tmp_path,
                                                                          monkeypatch):
    """A model given by path: its family is known once loaded (trainer/run/caches.py checks
    the controls again then)."""
    as_edit_family(monkeypatch, max=1)
    data = prepare(pairs(tmp_path))
    with pytest.raises(DatasetError, match="dataset.control_dir is set but FLUX.1"):
        data.use_controls(data.controls, "flux1")


def test_the_control_setting_is_shown_for_edit_families_only():
    from kohya_gui.family_view import applies

    assert [f for f in FAMILIES if applies("dataset.control_dir", f)] == list(edit_families())
    assert applies("dataset.control_dir", None)  # an unknown model shows every field
    assert applies("dataset.flip_aug", FAMILY)


def test_prepare_dataset_refuses_controls_for_the_configs_family(tmp_path):
    train = pairs(tmp_path)
    cfg = config(train)  # the embedded SD 1.x model, which takes no controls
    with pytest.raises(DatasetError, match="is not an edit model"):
        prepare_dataset(cfg, lambda _: None, data_home=tmp_path)


def test_held_out_images_keep_their_controls(tmp_path, monkeypatch):
    """dataset.validation_split: a held-out image's control is no orphan; it is kept for the
    validation images beside the training images' controls."""
    as_edit_family(monkeypatch, max=1, required=1)
    data = prepare(pairs(tmp_path), validation_split=0.3)
    [held] = data.held_out
    [held_controls] = data.held_out_controls
    assert held_controls.images[0].path.name == held.path.name
    assert [s.images[0].path.name for s in data.controls] == [e.path.name for e in data.entries]
