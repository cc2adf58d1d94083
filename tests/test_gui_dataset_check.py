"""Check dataset with regularization images and prior preservation: the reg samples are named and
counted, class images still to generate are announced and counted where the run's second scan
will find them, and the steps shown are the ones the run has (checked against a rescan after the
images exist, and once against the real trainer through the runner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gui_helpers import CLASS_IMAGES, gui_home, one_torch_thread, wait_for  # noqa: F401
from PIL import Image

from kohya_gui.dataset_check import check_dataset, class_images_to_generate, with_class_images
from kohya_gui.runner import Runner
from trainer.config import TrainConfig
from trainer.config import files as config_io
from trainer.config.plan import plan_steps
from trainer.data import prepare_dataset

BUCKETS = {"resolution": 96, "min_bucket_reso": 64, "max_bucket_reso": 192,
           "bucket_reso_steps": 32}


def image(path: Path, size: tuple[int, int], caption: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (40 * len(path.stem) % 255, 90, 160)).save(path)
    if caption:
        path.with_suffix(".txt").write_text(caption)


def make_config(tmp_path: Path, mode: str = "dreambooth", batch: int = 2, **dataset) -> TrainConfig:
    return config_io.from_dict({
        "mode": mode,
        "dataset": {"train_data_dir": str(tmp_path / "train"), **BUCKETS, **dataset},
        "training": {"train_batch_size": batch, "max_train_epochs": 1, "log_with": "none"},
        "saving": {"output_dir": str(tmp_path / "out"), "output_name": "check"}})


def two_shapes(tmp_path: Path) -> None:
    """2 training images (a 64x128 and a 96x96) repeated twice: 4 samples per epoch."""
    image(tmp_path / "train" / "2_shapes" / "tall.png", (64, 128), "a tall shape")
    image(tmp_path / "train" / "2_shapes" / "square.png", (96, 96), "a square shape")


def steps(cfg: TrainConfig, data) -> int:
    tr = cfg.training
    return plan_steps(data.steps_per_epoch(tr.train_batch_size), tr.gradient_accumulation_steps,
                      tr.max_train_steps, tr.max_train_epochs).total_steps


def test_regularization_samples_are_counted_and_said_to_interleave(tmp_path):
    two_shapes(tmp_path)
    for name in ("a", "b", "c"):
        image(tmp_path / "reg" / "1_shape" / f"{name}.png", (128, 64))
    cfg = make_config(tmp_path, mode="lora", reg_data_dir=str(tmp_path / "reg"))
    text = check_dataset(cfg)
    assert "**2 training images x repeats = 4 samples per epoch**" in text, text
    assert "plus **4 regularization samples** from 3 regularization image(s)" in text
    assert "interleaved with the training images" in text and "twice" in text
    assert "**8 samples per epoch**" in text
    # buckets 64x128: 2, 96x96: 2, 128x64: 4 -> 1 + 1 + 2 batches of 2
    assert "4 batches per epoch" in text and "-> **4 steps**" in text
    assert "| 128x64 | 4 |" in text and "will be generated" not in text
    alone = check_dataset(make_config(tmp_path, mode="lora"))
    assert "regularization" not in alone and "-> **2 steps**" in alone, alone


def test_class_images_to_generate_are_counted_as_the_run_will(tmp_path):
    two_shapes(tmp_path)
    image(tmp_path / "reg" / "1_dog" / "z.png", (128, 64))  # sorts after class_00000.png
    cfg = make_config(tmp_path, reg_data_dir=str(tmp_path / "reg"), num_class_images=3)
    text = check_dataset(cfg)
    assert "**2 class image(s) will be generated before training**" in text, text
    assert "(1 there now, dataset.num_class_images = 3), 96x96 each, prompt 'dog'" in text
    assert "plus **4 regularization samples** from 3 regularization image(s), 2 of them " \
           "generated before training" in text
    # 4 reg samples over z, class_00000, class_00001 (1 repeat each): the spare one goes to
    # the first read, class_00000 (96x96): buckets 64x128: 2, 96x96: 2+2+1, 128x64: 1
    assert "| 96x96 | 5 |" in text and "| 128x64 | 1 |" in text
    assert "5 batches per epoch" in text and "-> **5 steps**" in text
    todo, have = class_images_to_generate(cfg)
    predicted = with_class_images(cfg, prepare_dataset(cfg, warn=print), todo)
    assert have == 1 and todo.indices == [0, 1]
    for i in todo.indices:  # what the generation writes: squares of dataset.resolution
        image(todo.folder / f"class_{i:05d}.png", (96, 96), "dog")
    rescanned = prepare_dataset(cfg, warn=print)
    assert rescanned.bucket_table() == predicted.bucket_table()
    assert steps(cfg, rescanned) == steps(cfg, predicted) == 5
    again = check_dataset(cfg)
    assert "holds 3 image(s) (dataset.num_class_images = 3): none to generate" in again
    assert "-> **5 steps**" in again and "generated before training" not in again


def test_an_empty_class_folder_and_an_ambiguous_one(tmp_path):
    two_shapes(tmp_path)
    cfg = make_config(tmp_path, reg_data_dir=str(tmp_path / "reg"), num_class_images=4,
                      class_prompt="a photo of a shape")
    text = check_dataset(cfg)  # no reg folder yet: all four are generated into 1_<prompt>
    assert "**4 class image(s) will be generated before training**" in text, text
    assert str(tmp_path / "reg" / "1_a photo of a shape") in text
    assert "plus **4 regularization samples** from 4 regularization image(s)" in text
    assert "| 96x96 | 6 |" in text and "-> **4 steps**" in text  # 1 + 3 batches of 2
    for name in ("1_dog", "1_cat"):
        image(tmp_path / "reg" / name / "x.png", (96, 96))
    ambiguous = make_config(tmp_path, reg_data_dir=str(tmp_path / "reg"), num_class_images=4)
    assert "cannot be used" in check_dataset(ambiguous)
    assert "dataset.class_prompt" in check_dataset(ambiguous)


@pytest.mark.usefixtures("gui_home", "one_torch_thread")
def test_the_real_run_generates_the_class_images_and_has_the_steps_shown(tmp_path):
    image(tmp_path / "train" / "1_shape" / "one.png", (64, 64), "a red shape")
    image(tmp_path / "train" / "1_shape" / "two.png", (64, 128), "a tall shape")
    cfg = config_io.from_dict({
        "mode": "dreambooth",
        "dataset": {"train_data_dir": str(tmp_path / "train"), "resolution": 64,
                    "min_bucket_reso": 64, "max_bucket_reso": 128, "bucket_reso_steps": 64,
                    "reg_data_dir": str(tmp_path / "reg"), "num_class_images": 3,
                    "class_prompt": "a shape"},
        "training": {"train_batch_size": 2, "max_train_epochs": 1, "log_with": "none"},
        "sampling": {"sample_steps": 2},
        "saving": {"output_dir": str(tmp_path / "out"), "output_name": "db",
                   "save_precision": "fp32"}})
    text = check_dataset(cfg)
    assert "**3 class image(s) will be generated before training**" in text, text
    todo, _ = class_images_to_generate(cfg)
    predicted = with_class_images(cfg, prepare_dataset(cfg, warn=print), todo)
    runner = Runner()
    try:
        runner.submit(cfg)
        assert runner.wait_idle(300)
        snap = runner.snapshot()
    finally:
        runner.close()
    assert snap["status"] == "finished", snap["error"]
    assert snap["total"] == steps(cfg, predicted) and f"-> **{snap['total']} steps**" in text
    assert snap["started"]["buckets"] == predicted.bucket_table()
    assert any(line.endswith(f"{CLASS_IMAGES}: 3/3") for line in snap["log"]), snap["log"]
    assert snap["preparing"] is None
    assert sorted(p.name for p in todo.folder.glob("*.png")) == [
        "class_00000.png", "class_00001.png", "class_00002.png"]
