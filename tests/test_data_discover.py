"""Folder discovery, captions, regularization images, and bad data reported in one error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainer.config import TrainConfig
from trainer.data import DatasetError, prepare_dataset
from trainer.data.discover import parse_concept_folder


def write_image(path: Path, size=(128, 128), color=(200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def make_cfg(train_dir: Path, **dataset) -> TrainConfig:
    values = dict(train_data_dir=str(train_dir), resolution=128, min_bucket_reso=64,
                  max_bucket_reso=256, bucket_reso_steps=32, cache_latents=False)
    values.update(dataset)
    return TrainConfig(dataset=values, training={"prior_loss_weight": 0.25})


def prepare(cfg: TrainConfig, tmp_path: Path):
    warnings: list[str] = []
    data = prepare_dataset(cfg, warnings.append, data_home=tmp_path / "home")
    return data, warnings


def test_parse_concept_folder():
    assert parse_concept_folder("10_my cat") == (10, "my cat")
    assert parse_concept_folder("3_a_b") == (3, "a_b")
    assert parse_concept_folder("cats") is None
    assert parse_concept_folder("x_cats") is None


def test_discovers_concept_folders_and_warns_about_the_others(tmp_path):
    root = tmp_path / "train"
    write_image(root / "2_cat" / "a.png")
    write_image(root / "2_cat" / "b.jpg")
    write_image(root / "3_dog" / "c.webp")
    write_image(root / "misc" / "ignored.png")
    write_image(root / "0_zero" / "ignored.png")
    write_image(root / ".cache" / "hidden.png")
    data, warnings = prepare(make_cfg(root), tmp_path)
    assert data.num_images == 3
    assert data.num_repeated == 2 + 2 + 3
    assert sorted(p.name for p in (e.path for e in data.entries)) == ["a.png", "b.jpg", "c.webp"]
    assert len(warnings) == 1
    assert "misc" in warnings[0] and "0_zero" in warnings[0] and ".cache" not in warnings[0]


def test_captions_from_files_else_the_folder_name(tmp_path):
    root = tmp_path / "train"
    write_image(root / "5_sks dog" / "with.png")
    write_image(root / "5_sks dog" / "without.png")
    write_image(root / "5_sks dog" / "blank.png")
    (root / "5_sks dog" / "with.txt").write_text("\ufeffa dog, running\nsecond line\n", "utf-8")
    (root / "5_sks dog" / "blank.txt").write_text("  \n", "utf-8")
    data, _ = prepare(make_cfg(root), tmp_path)
    captions = {e.path.name: e.caption for e in data.entries}
    assert captions == {"with.png": "a dog, running", "without.png": "sks dog",
                        "blank.png": "sks dog"}


def test_caption_extension_from_config(tmp_path):
    root = tmp_path / "train"
    write_image(root / "1_cat" / "a.png")
    (root / "1_cat" / "a.txt").write_text("wrong", "utf-8")
    (root / "1_cat" / "a.caption").write_text("right", "utf-8")
    data, _ = prepare(make_cfg(root, caption_extension=".caption"), tmp_path)
    assert data.entries[0].caption == "right"


def test_regularization_images_match_the_training_samples(tmp_path):
    train, reg = tmp_path / "train", tmp_path / "reg"
    write_image(train / "5_sks cat" / "a.png")
    write_image(train / "5_sks cat" / "b.png")
    for name in "pqr":
        write_image(reg / "1_cat" / f"{name}.png", color=(0, 0, 200))
    data, _ = prepare(make_cfg(train, reg_data_dir=str(reg)), tmp_path)
    assert data.num_images == 5
    assert data.num_repeated == 10 + 10  # 3 reg images stretched to 10 samples
    reg_counts = [c for c, e in zip(data.counts, data.entries) if e.is_reg]
    assert sorted(reg_counts) == [3, 3, 4]
    weights: dict[str, list[float]] = {}
    for batch in data.epoch(0, batch_size=4, seed=1):
        for path, weight in zip(batch.paths, batch.loss_weights.tolist()):
            weights.setdefault(path.parent.parent.name, []).append(weight)
    assert weights["train"] == [1.0] * 10
    assert weights["reg"] == [0.25] * 10


def test_reg_samples_are_cut_when_there_are_more_reg_images(tmp_path):
    train, reg = tmp_path / "train", tmp_path / "reg"
    write_image(train / "1_cat" / "a.png")
    for index in range(4):
        write_image(reg / "2_cat" / f"r{index}.png")
    data, _ = prepare(make_cfg(train, reg_data_dir=str(reg)), tmp_path)
    assert data.num_repeated == 2


def write_bad_dataset(root: Path) -> None:
    folder = root / "1_bad"
    write_image(folder / "good.png")
    (folder / "zero.png").write_bytes(b"")
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg" * 20)
    noise = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "whole.png")
    data = (folder / "whole.png").read_bytes()
    (folder / "truncated.png").write_bytes(data[: len(data) // 2])
    (folder / "whole.png").unlink()
    write_image(folder / "latin1.png")
    (folder / "latin1.txt").write_bytes("caf\xe9, cr\xe8me".encode("latin-1"))
    write_image(folder / "tiny.png", size=(40, 50))


def test_every_bad_file_is_reported_in_one_error(tmp_path):
    root = tmp_path / "train"
    write_bad_dataset(root)
    with pytest.raises(DatasetError) as caught:
        prepare(make_cfg(root), tmp_path)
    problems = caught.value.problems
    assert len(problems) == 5, problems
    by_file = {name: [p for p in problems if name in p] for name in
               ["zero.png", "corrupt.jpg", "truncated.png", "latin1.txt", "tiny.png"]}
    assert all(len(found) == 1 for found in by_file.values()), by_file
    assert "0 bytes" in by_file["zero.png"][0]
    assert "not a readable image" in by_file["corrupt.jpg"][0]
    assert "truncated" in by_file["truncated.png"][0]
    assert "UTF-8" in by_file["latin1.txt"][0]
    assert "dataset.min_bucket_reso" in by_file["tiny.png"][0]
    assert "good.png" not in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_small_images_pass_with_no_upscale(tmp_path):
    root = tmp_path / "train"
    write_image(root / "1_x" / "tiny.png", size=(40, 50))
    data, _ = prepare(make_cfg(root, bucket_no_upscale=True, bucket_reso_steps=8), tmp_path)
    assert data.bucket_table() == {"40x48": 1}


def test_missing_train_data_dir_names_the_field(tmp_path):
    with pytest.raises(DatasetError) as caught:
        prepare(make_cfg(tmp_path / "nowhere"), tmp_path)
    (problem,) = caught.value.problems
    assert "dataset.train_data_dir" in problem and "does not exist" in problem
    assert "N_concept" in problem


def test_missing_reg_data_dir_names_the_field(tmp_path):
    root = tmp_path / "train"
    write_image(root / "1_x" / "a.png")
    with pytest.raises(DatasetError, match="dataset.reg_data_dir"):
        prepare(make_cfg(root, reg_data_dir=str(tmp_path / "noreg")), tmp_path)


def test_empty_dataset_is_an_error(tmp_path):
    root = tmp_path / "train"
    (root / "10_empty").mkdir(parents=True)
    (root / "10_empty" / "notes.txt").write_text("no images here")
    with pytest.raises(DatasetError) as caught:
        prepare(make_cfg(root), tmp_path)
    assert "no images found" in caught.value.problems[0]


def test_config_conflicts_fail_before_training(tmp_path):
    root = tmp_path / "train"
    write_image(root / "1_x" / "a.png")
    cfg = make_cfg(root, random_crop=True, cache_latents=True, shuffle_caption=True,
                   cache_text_encoder_outputs=True)
    with pytest.raises(DatasetError) as caught:
        prepare(cfg, tmp_path)
    text = str(caught.value)
    assert "dataset.random_crop" in text and "dataset.cache_latents" in text
    assert "dataset.cache_text_encoder_outputs" in text and "dataset.shuffle_caption" in text
