"""musubi-tuner's dataset TOML (issue 31): its image datasets (``image_directory``,
``caption_extension``, ``resolution``, ``batch_size``, ``enable_bucket``,
``bucket_no_upscale``, ``num_repeats``, ``cache_directory``, from ``[general]`` or each
``[[datasets]]``) read as sd-scripts' form is, told apart by its keys; video, layered,
FramePack and JSONL keys refused, each with its reason, naming the file and the key (the
control keys import: tests/test_data_controls.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_import_dataset_toml import README_FORM, folders, write

from trainer.config import files as config_io
from trainer.data import DatasetError, prepare_dataset
from trainer.data.dataset_toml import DatasetTomlError, load_dataset_toml, read_toml
from trainer.data.musubi_toml import is_musubi

BUCKETS = {"resolution": 64, "min_bucket_reso": 64, "max_bucket_reso": 128,
           "bucket_reso_steps": 64, "cache_latents": False}

# the form of musubi-tuner's docs/dataset_config.md "Sample for Image Dataset with Caption
# Text Files", at test sizes
MUSUBI_FORM = """
[general]
resolution = [64, 64]
caption_extension = ".caption"
batch_size = 1
enable_bucket = true
bucket_no_upscale = false

[[datasets]]
image_directory = "cats"
cache_directory = "cache/cats"
num_repeats = 3

[[datasets]]
image_directory = "dogs"
cache_directory = "cache/dogs"
caption_extension = ".txt"
resolution = [128, 64]
enable_bucket = false
"""


def config(toml: Path, training=None, **dataset):
    return config_io.from_dict({"mode": "lora", "dataset": {**BUCKETS, **dataset,
                                                            "dataset_config": str(toml)},
                                "training": {"train_batch_size": 1, **(training or {})}})


def captions_as(root: Path, folder: str, ext: str) -> None:
    for txt in (root / folder).glob("*.txt"):
        txt.with_suffix(ext).write_text(txt.read_text())


def test_musubi_image_datasets_read_as_sd_scripts_datasets(tmp_path):
    folders(tmp_path)
    captions_as(tmp_path, "cats", ".caption")
    toml = write(tmp_path, MUSUBI_FORM)
    loaded = load_dataset_toml(toml, config(toml, flip_aug=True))
    cats, dogs = loaded.subsets
    assert (cats.image_dir, dogs.image_dir) == (tmp_path / "cats", tmp_path / "dogs")
    assert (cats.repeats, dogs.repeats) == (3, 1)
    assert (cats.caption_extension, dogs.caption_extension) == (".caption", ".txt")
    assert (cats.options.spec.resolution, cats.options.spec.enabled) == (64, True)
    assert (dogs.options.spec.base, dogs.options.spec.enabled) == ((128, 64), False)
    assert not cats.options.spec.no_upscale
    assert [s.options.dataset for s in loaded.subsets] == [0, 1]
    assert cats.options.flip_aug  # unset in the TOML: the run's dataset section
    assert loaded.batch_sizes == {"datasets[0].batch_size": 1, "datasets[1].batch_size": 1}
    # the advisor's stamp of the TOML's folders reads the same subsets
    assert [d["subsets"] for d in read_toml(toml)["datasets"]] == [
        [{"image_dir": "cats"}], [{"image_dir": "dogs"}]]


def test_musubi_dataset_prepares_and_its_captions_are_read(tmp_path):
    folders(tmp_path)
    captions_as(tmp_path, "cats", ".caption")
    toml = write(tmp_path, MUSUBI_FORM)
    data = prepare_dataset(config(toml), lambda _: None)
    counts = {e.path.name: c for e, c in zip(data.entries, data.counts)}
    assert counts == {"a.png": 3, "b.png": 3, "c.png": 1}
    by_name = {e.path.name: b for e, b in zip(data.entries, data.buckets)}
    assert by_name["a.png"] == (64, 64) and by_name["c.png"] == (128, 64)
    captions = {b.paths[0].name: b.captions[0] for b in data.epoch(1, 1, seed=0)}
    assert captions["a.png"] == "cat, red, fluffy, sitting"


def test_batch_size_follows_the_sd_scripts_rule(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, "[general]\nbatch_size = 2\n[[datasets]]\nimage_directory = 'cats'\n")
    with pytest.raises(DatasetTomlError, match=r"datasets\[0\]\.batch_size = 2 differs from "
                                               r"training\.train_batch_size = 1"):
        load_dataset_toml(toml, config(toml))


def test_the_form_is_told_by_its_keys():
    import tomllib

    assert not is_musubi(tomllib.loads(README_FORM))
    assert is_musubi(tomllib.loads(MUSUBI_FORM))
    assert is_musubi({"datasets": [{"video_directory": "v"}]})
    assert not is_musubi({"datasets": [{"image_directory": "x", "subsets": []}]})


@pytest.mark.parametrize(("text", "expected"), [
    ("[[datasets]]\nvideo_directory = 'clips'\ntarget_frames = [1, 25]\n",
     ["datasets[0].video_directory: musubi-tuner's video_directory: video datasets are not "
      "trained here yet", "datasets[0].target_frames: musubi-tuner's target_frames: video "
      "datasets are not trained here yet"]),
    ("[[datasets]]\nvideo_jsonl_file = 'v.jsonl'\nframe_extraction = 'head'\n",
     ["datasets[0].video_jsonl_file: musubi-tuner's video_jsonl_file: video datasets",
      "datasets[0].frame_extraction: musubi-tuner's frame_extraction: video datasets"]),
    ("[[datasets]]\nimage_directory = 'cats'\ncontrol_directory = 'edits'\n",
     ["datasets[0].subsets[0].control_directory: folder", "edits does not exist"]),
    ("[[datasets]]\nimage_jsonl_file = 'm.jsonl'\ncache_directory = 'c'\n",
     ["datasets[0].image_jsonl_file: musubi-tuner's image_jsonl_file: metadata JSONL files are "
      "not read"]),
    ("[[datasets]]\nimage_directory = 'cats'\nmultiple_target = true\n",
     ["datasets[0].multiple_target: musubi-tuner's multiple_target: Qwen-Image-Layered"]),
    ("[[datasets]]\nimage_directory = 'cats'\nfp_latent_window_size = 9\n",
     ["datasets[0].fp_latent_window_size: musubi-tuner's fp_latent_window_size: a FramePack"]),
    ("[[datasets]]\ncache_directory = 'c'\n",
     ["datasets[0].image_directory: required (the folder of its images)"]),
    ("[[datasets]]\nimage_directory = ''\n",
     ["datasets[0].image_directory = '': must be a non-empty string"]),
])
def test_refused_keys_name_the_file_the_key_and_the_reason(tmp_path, text, expected):
    folders(tmp_path)
    toml = write(tmp_path, text)
    with pytest.raises(DatasetError) as info:
        prepare_dataset(config(toml), lambda _: None)
    message = str(info.value)
    assert f"dataset.dataset_config ({toml}): " in message
    for part in expected:
        assert part in message


def test_other_keys_get_the_sd_scripts_checks(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, "[[datasets]]\nimage_directory = 'cats'\nnum_repeat = 2\n"
                           "resolution = [64, 64, 64]\n")
    with pytest.raises(DatasetTomlError) as info:
        load_dataset_toml(toml, config(toml))
    assert "datasets[0].num_repeat: unknown key; did you mean num_repeats?" in info.value.problems
    assert "datasets[0].resolution = [64, 64, 64]: must be an int or [width, height]" in \
        info.value.problems
