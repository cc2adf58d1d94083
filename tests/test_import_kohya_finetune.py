"""kohya_ss's finetune tab (issue 21): its images lie directly in image_folder and repeat
``dataset_repeats`` times per epoch (sd-scripts' --dataset_repeats, the num_repeats of
fine_tune.py's one subset). The shipped finetune presets import with nothing "not supported",
dataset.dataset_repeats trains the images placed directly in train_data_dir that many times
(and is the num_repeats of dataset TOML subsets that set none), and an imported finetune
preset trains on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image
from train_helpers import small_config

from trainer.config import EMBEDDED_MODEL
from trainer.config import files as config_io
from trainer.data import DatasetError, prepare_dataset
from trainer.events import ListSink, Started
from trainer.importers.kohya import import_kohya
from trainer.run.loop import run

DATA = Path(__file__).parent / "data" / "kohya_ss"
FINETUNE = json.loads((DATA / "finetune_presets.json").read_text())["presets"]
SMALL = {"resolution": 64, "min_bucket_reso": 64, "max_bucket_reso": 128,
         "bucket_reso_steps": 64, "cache_latents": False, "cache_latents_to_disk": False,
         "cache_text_encoder_outputs": False}


def flat_folder(root: Path, count: int, captions: bool = True) -> list[Path]:
    """``count`` 64 px images directly in ``root`` (the finetune layout), each with a caption
    file unless ``captions`` is off."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = root / f"img{i}.png"
        Image.new("RGB", (64, 64), (20 * i, 90, 200 - 20 * i)).save(path)
        if captions:
            path.with_suffix(".txt").write_text(f"a picture, number {i}")
        paths.append(path)
    return paths


def small(cfg, tmp_path: Path, **training):
    """``cfg`` at 64 px on the tiny model, with the dataset options of the file kept."""
    raw = config_io.to_dict(cfg)
    raw["model"] = {"pretrained_model_name_or_path": EMBEDDED_MODEL}
    raw["dataset"].update(SMALL)
    raw["training"].update(mixed_precision="no", full_bf16=False, gradient_checkpointing=False,
                           log_with="none", **training)
    raw["saving"].update(output_dir=str(tmp_path / "out"), save_every_n_epochs=None,
                         save_precision="fp32")
    raw["sampling"] = {}
    return config_io.from_dict(raw)


@pytest.mark.parametrize("name", sorted(FINETUNE))
def test_every_finetune_preset_imports_dataset_repeats_with_nothing_unsupported(name):
    data = FINETUNE[name]
    cfg, report = import_kohya(data, source=name)
    assert report.unsupported == []
    assert "Not supported" not in report.text()
    assert cfg.dataset.dataset_repeats == int(data["dataset_repeats"])
    assert ("dataset_repeats", data["dataset_repeats"], "dataset.dataset_repeats",
            int(data["dataset_repeats"])) in report.mapped


def test_lion_and_adafactor_presets_set_ten_repeats():
    for name in ("finetune/lion", "finetune/adafactor"):
        cfg, _ = import_kohya(FINETUNE[name])
        assert cfg.dataset.dataset_repeats == 10


def test_a_finetune_folder_gives_images_x_repeats_per_epoch(tmp_path):
    preset = dict(FINETUNE["finetune/lion"], image_folder=str(tmp_path / "images"))
    images = flat_folder(tmp_path / "images", 4)
    cfg, report = import_kohya(preset)
    data = prepare_dataset(small(cfg, tmp_path), warn=lambda _msg: None)
    repeats, batch = int(preset["dataset_repeats"]), int(preset["train_batch_size"])
    assert (data.num_images, data.num_repeated) == (len(images), len(images) * repeats)
    assert data.steps_per_epoch(batch) == math.ceil(len(images) * repeats / batch)  # one bucket
    assert {e.caption for e in data.entries} == {p.with_suffix(".txt").read_text()
                                                 for p in images}
    # the warm-up percentage is of the steps that the folder gives: 10 % of 4 x 10 / 4 x 2
    epochs, percent = int(preset["epoch"]), float(preset["lr_warmup"])
    total = len(images) * repeats // batch * epochs
    assert cfg.optimizer.lr_warmup_steps == int(percent / 100 * total)
    assert "dataset_repeats" not in [k for k, *_ in report.unsupported]


def test_images_in_the_folder_are_not_trained_without_dataset_repeats(tmp_path):
    flat_folder(tmp_path / "images", 2)
    cfg = small_config(tmp_path, tmp_path / "images", dataset=SMALL)
    assert cfg.dataset.dataset_repeats is None
    warnings: list[str] = []
    with pytest.raises(DatasetError) as caught:
        prepare_dataset(cfg, warn=warnings.append)
    assert "dataset.dataset_repeats" in str(caught.value)
    assert any("img0.png" in w and "dataset.dataset_repeats" in w for w in warnings)


def test_folder_images_and_concept_folders_each_keep_their_repeats(tmp_path):
    flat_folder(tmp_path / "images", 3)
    flat_folder(tmp_path / "images" / "2_cat", 2)
    cfg = small_config(tmp_path, tmp_path / "images", dataset={**SMALL, "dataset_repeats": 5})
    data = prepare_dataset(cfg, warn=lambda _msg: None)
    assert (data.num_images, data.num_repeated) == (5, 3 * 5 + 2 * 2)
    assert data.dataset_dirs() == {"images": {"n_repeats": 5, "img_count": 3},
                                   "2_cat": {"n_repeats": 2, "img_count": 2}}


def test_an_image_without_a_caption_file_trains_with_an_empty_caption(tmp_path):
    flat_folder(tmp_path / "images", 2, captions=False)
    cfg = small_config(tmp_path, tmp_path / "images", dataset={**SMALL, "dataset_repeats": 1})
    warnings: list[str] = []
    data = prepare_dataset(cfg, warn=warnings.append)
    assert [e.caption for e in data.entries] == ["", ""]
    assert any("2 image(s)" in w and "empty caption" in w for w in warnings)


def test_dataset_repeats_is_the_num_repeats_of_toml_subsets_that_set_none(tmp_path):
    flat_folder(tmp_path / "a", 2)
    flat_folder(tmp_path / "b", 1)
    toml = tmp_path / "d.toml"
    toml.write_text('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "a"\n'
                    '[[datasets.subsets]]\nimage_dir = "b"\nnum_repeats = 2\n')
    for repeats, expected in ((None, 2 * 1 + 1 * 2), (7, 2 * 7 + 1 * 2)):
        cfg = small_config(tmp_path, tmp_path, dataset={
            **SMALL, "train_data_dir": "", "dataset_config": str(toml),
            "dataset_repeats": repeats})
        assert prepare_dataset(cfg, warn=lambda _msg: None).num_repeated == expected


def test_dataset_repeats_is_checked_with_the_kohya_key_named():
    from trainer.config.files import ConfigError

    with pytest.raises(ConfigError) as caught:
        import_kohya(dict(FINETUNE["finetune/lion"], dataset_repeats="-3"))
    assert "dataset.dataset_repeats" in str(caught.value)
    assert "dataset_repeats" in str(caught.value).split("kohya_ss key")[-1]


def test_an_imported_finetune_preset_trains_two_steps(tmp_path):
    preset = dict(FINETUNE["finetune/lion"], image_folder=str(tmp_path / "images"))
    images = flat_folder(tmp_path / "images", 3)
    cfg, _ = import_kohya(preset)
    sink = ListSink()
    result = run(small(cfg, tmp_path, max_train_steps=2, max_train_epochs=None,
                       train_batch_size=2), sink)
    assert result.status == "finished", result.error
    started = sink.of(Started)[0]
    repeats = int(preset["dataset_repeats"])
    assert started.num_repeated_images == len(images) * repeats
    assert started.steps_per_epoch == math.ceil(len(images) * repeats / 2)
    assert started.total_steps == 2 and result.step == 2
