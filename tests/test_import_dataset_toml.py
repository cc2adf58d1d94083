"""sd-scripts' dataset TOML (dataset.dataset_config): [general] / [[datasets]] /
[[datasets.subsets]] inheritance, per-subset options really applied, errors that name the file
and the key, the cache, validation and Check-dataset paths, and a short training run."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from train_helpers import small_config

from trainer.config import TrainConfig
from trainer.config import files as config_io
from trainer.data import DatasetError, prepare_dataset
from trainer.data.dataset_toml import DatasetTomlError, load_dataset_toml

BUCKETS = {"resolution": 64, "min_bucket_reso": 64, "max_bucket_reso": 128,
           "bucket_reso_steps": 64, "cache_latents": False}


def picture(path: Path, size=(64, 64), caption: str | None = None, shade: int = 0) -> None:
    """An image whose flip differs from it: red ramps up from left to right."""
    path.parent.mkdir(parents=True, exist_ok=True)
    x = np.linspace(0, 255, size[0])[None, :].repeat(size[1], 0)
    rgb = np.stack([x, np.full_like(x, 90), np.full_like(x, shade)], -1).astype(np.uint8)
    Image.fromarray(rgb).save(path)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)


def folders(root: Path) -> None:
    """cats/ (2 captioned images), dogs/ (1), reg/ (2 without captions)."""
    picture(root / "cats" / "a.png", caption="cat, red, fluffy, sitting", shade=10)
    picture(root / "cats" / "b.png", caption="cat, grey, sleeping, indoors", shade=20)
    picture(root / "dogs" / "c.png", caption="dog, brown, running, park", shade=30)
    picture(root / "reg" / "r1.png", shade=40)
    picture(root / "reg" / "r2.png", shade=50)


def write(root: Path, text: str) -> Path:
    path = root / "dataset.toml"
    path.write_text(text)
    return path


def config(toml: Path, mode: str = "lora", training=None, **dataset) -> TrainConfig:
    return config_io.from_dict({"mode": mode, "dataset": {**BUCKETS, **dataset,
                                                          "dataset_config": str(toml)},
                                "training": {"train_batch_size": 1, **(training or {})}})


def prepared(toml: Path, **dataset):
    return prepare_dataset(config(toml, **dataset), lambda _: None)


README_FORM = """
[general]
shuffle_caption = true
caption_extension = '.txt'
keep_tokens = 1

[[datasets]]
resolution = 64
batch_size = 1
keep_tokens = 2

  [[datasets.subsets]]
  image_dir = 'cats'
  class_tokens = 'cat'
  cache_info = true

  [[datasets.subsets]]
  image_dir = 'dogs'
  keep_tokens = 3
  num_repeats = 4

  [[datasets.subsets]]
  is_reg = true
  image_dir = 'reg'
  class_tokens = 'animal'

[[datasets]]
resolution = [128, 64]
enable_bucket = false

  [[datasets.subsets]]
  image_dir = 'dogs'
"""


def test_general_dataset_and_subset_values_are_inherited_as_sd_scripts_does(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, README_FORM)
    loaded = load_dataset_toml(toml, config(toml, flip_aug=True, caption_prefix="photo"))
    cats, dogs, reg, wide = loaded.subsets
    assert [s.options.caption.keep_tokens for s in loaded.subsets] == [2, 3, 2, 1]
    assert all(s.options.caption.shuffle for s in loaded.subsets)  # from [general]
    assert (cats.repeats, dogs.repeats, reg.repeats) == (1, 4, 1)
    assert (cats.is_reg, reg.is_reg, reg.class_tokens) == (False, True, "animal")
    assert cats.image_dir == tmp_path / "cats"  # relative to the TOML's folder
    # unset everywhere in the TOML: the run's dataset section (sd-scripts: its arguments)
    assert cats.options.flip_aug and cats.options.caption.prefix == "photo"
    assert cats.options.spec.resolution == 64 and cats.options.spec.enabled
    assert (wide.options.spec.base, wide.options.spec.enabled) == ((128, 64), False)
    assert [s.options.dataset for s in loaded.subsets] == [0, 0, 0, 1]
    assert loaded.batch_sizes == {"datasets[0].batch_size": 1}


def _batches(data, epochs=range(1, 9)):
    """path name -> (captions, pixel views) over several epochs of batch size 1."""
    seen = defaultdict(lambda: (Counter(), set()))
    for epoch in epochs:
        for batch in data.epoch(epoch, 1, seed=0):
            captions, views = seen[batch.paths[0].name]
            captions[batch.captions[0]] += 1
            views.add(batch.pixels[0].numpy().tobytes())
    return seen


def test_per_subset_options_are_applied_per_subset(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, """
[general]
caption_extension = ".txt"
[[datasets]]
  [[datasets.subsets]]
  image_dir = "cats"
  num_repeats = 10
  flip_aug = true
  shuffle_caption = true
  keep_tokens = 1
  [[datasets.subsets]]
  image_dir = "dogs"
  num_repeats = 2
  caption_prefix = "photo of"
  [[datasets.subsets]]
  image_dir = "reg"
  is_reg = true
  class_tokens = "an animal"
""")
    data = prepared(toml)
    counts = {e.path.name: c for e, c in zip(data.entries, data.counts)}
    assert counts["a.png"] == counts["b.png"] == 10 and counts["c.png"] == 2
    assert counts["r1.png"] + counts["r2.png"] == 22  # as many reg samples as training samples
    seen = _batches(data)
    cat_captions, cat_views = seen["a.png"]
    assert len(cat_captions) > 3 and all(c.startswith("cat, ") for c in cat_captions)
    assert len(cat_views) == 2  # flipped and not
    assert seen["c.png"][0].keys() == {"photo of, dog, brown, running, park"}
    assert len(seen["c.png"][1]) == 1  # never flipped
    assert set(seen["r1.png"][0]) == {"an animal"}  # class tokens: no caption files
    weights = {b.paths[0].name: float(b.loss_weights[0]) for b in data.epoch(1, 1, seed=0)}
    assert weights["r1.png"] == data.prior_loss_weight and weights["a.png"] == 1.0
    assert data.tag_frequency().keys() == {"cats", "dogs"}


def test_per_dataset_resolution_and_reg_matching_per_dataset(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, """
[general]
enable_bucket = false
[[datasets]]
resolution = 64
  [[datasets.subsets]]
  image_dir = "cats"
  num_repeats = 3
  [[datasets.subsets]]
  image_dir = "reg"
  is_reg = true
  class_tokens = "animal"
[[datasets]]
resolution = [128, 64]
  [[datasets.subsets]]
  image_dir = "dogs"
  num_repeats = 5
""")
    data = prepared(toml)
    by_name = {e.path.name: (b, c) for e, b, c in zip(data.entries, data.buckets, data.counts)}
    assert by_name["a.png"] == ((64, 64), 3) and by_name["c.png"] == ((128, 64), 5)
    assert by_name["r1.png"][1] + by_name["r2.png"][1] == 6  # the cats' 6, not 6 + 5
    assert data.bucket_table() == {"128x64": 5, "64x64": 12}


def test_keep_tokens_separator_and_dropout_every_n_epochs(tmp_path):
    picture(tmp_path / "tags" / "t.png", caption="head, one ||| x, y, z, w ||| tail")
    toml = write(tmp_path, """
[[datasets]]
  [[datasets.subsets]]
  image_dir = "tags"
  num_repeats = 6
  shuffle_caption = true
  keep_tokens_separator = "|||"
  caption_suffix = "best"
  caption_dropout_every_n_epochs = 3
""")
    data = prepared(toml)
    captions = {epoch: [b.captions[0] for b in data.epoch(epoch, 1, seed=0)]
                for epoch in (1, 2, 3)}
    assert captions[3] == [""] * 6  # every 3rd epoch (epochs count from 1)
    shown = captions[1] + captions[2]
    assert all(c.startswith("head, one, ") and c.endswith(", tail, best") for c in shown)
    assert len(set(shown)) > 2 and not any("|||" in c for c in shown)


@pytest.mark.parametrize(("text", "expected"), [
    ('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "cats"\nnum_repeat = 3',
     "datasets[0].subsets[0].num_repeat: unknown key; did you mean num_repeats?"),
    ('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "cats"\nmetadata_file = "m.json"',
     "datasets[0].subsets[0].metadata_file: an sd-scripts option that this trainer does not "
     "support (fine-tuning subsets"),
    ('[general]\ntoken_warmup_step = 1\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = "cats"',
     "general.token_warmup_step: an sd-scripts option that this trainer does not support"),
    ('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "cats"\nbatch_size = 2',
     "datasets[0].subsets[0].batch_size: a per-dataset option"),
    ('[general]\nimage_dir = "cats"\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = "cats"',
     "general.image_dir: a per-subset option"),
    ('[[datasets]]\n[[datasets.subsets]]\nnum_repeats = 2',
     "datasets[0].subsets[0].image_dir: required"),
    ('[[datasets]]\nkeep_tokens = -1\n[[datasets.subsets]]\nimage_dir = "cats"',
     "datasets[0].keep_tokens = -1: must be >= 0"),
    ('[[datasets]]\nresolution = [64, 64, 64]\n[[datasets.subsets]]\nimage_dir = "cats"',
     "datasets[0].resolution = [64, 64, 64]: must be an int or [width, height]"),
    ('[[datasets]]\nbatch_size = 4\n[[datasets.subsets]]\nimage_dir = "cats"',
     "datasets[0].batch_size = 4 differs from training.train_batch_size = 1"),
    ('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "nowhere"',
     "datasets[0].subsets[0].image_dir: " + "{root}/nowhere does not exist"),
    ('[[datasets]]\n[[datasets.subsets]]\nimage_dir = "reg"',
     "datasets[0].subsets[0].class_tokens: not set, and 2 image(s) have no .txt caption"),
    ('[[datasets]\n', "not valid TOML"),
])
def test_errors_name_the_file_and_the_key(tmp_path, text, expected):
    folders(tmp_path)
    toml = write(tmp_path, text)
    with pytest.raises(DatasetError) as info:
        prepared(toml)
    assert f"dataset.dataset_config ({toml}): " in str(info.value)
    assert expected.format(root=tmp_path) in str(info.value)


def test_an_image_too_small_for_its_dataset_names_that_dataset(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'dogs'\n"
                           "[[datasets]]\nresolution = 256\nmin_bucket_reso = 128\n"
                           "max_bucket_reso = 256\n[[datasets.subsets]]\nimage_dir = 'cats'\n")
    with pytest.raises(DatasetError) as info:
        prepared(toml)
    assert len(info.value.problems) == 2  # the cats, not the dog of datasets[0]
    assert "a.png: 64x64 is smaller than datasets[1].min_bucket_reso (128)" in str(info.value)


def test_different_batch_sizes_across_datasets_are_refused(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, "[[datasets]]\nbatch_size = 2\n[[datasets.subsets]]\nimage_dir = "
                           "'cats'\n[[datasets]]\nbatch_size = 1\n[[datasets.subsets]]\n"
                           "image_dir = 'dogs'\n")
    with pytest.raises(DatasetTomlError) as info:
        load_dataset_toml(toml, config(toml, training={"train_batch_size": 1}))
    assert info.value.problems == [
        "datasets[0].batch_size = 2 differs from training.train_batch_size = 1: a run has one "
        "batch size; set training.train_batch_size = 2 or change or remove "
        "datasets[0].batch_size"]


def test_config_rules_dataset_config_replaces_the_folders(tmp_path):
    toml = str(tmp_path / "d.toml")
    for extra, named in (({"train_data_dir": str(tmp_path)}, "dataset.train_data_dir"),
                         ({"reg_data_dir": str(tmp_path)}, "dataset.reg_data_dir")):
        with pytest.raises(config_io.ConfigError,
                           match=f"dataset.dataset_config and {named} are both set"):
            config_io.from_dict({"dataset": {"dataset_config": toml, **extra}})
    with pytest.raises(config_io.ConfigError, match="num_class_images cannot be used with"):
        config_io.from_dict({"mode": "dreambooth", "dataset": {
            "dataset_config": toml, "num_class_images": 4}})
    config_io.from_dict({"dataset": {"dataset_config": toml, "train_data_dir": ""}})


def test_cache_validation_and_text_cache_follow_the_subsets(tmp_path):
    import torch

    folders(tmp_path)
    toml = write(tmp_path, """
[[datasets]]
  [[datasets.subsets]]
  image_dir = "cats"
  caption_dropout_rate = 1.0
  flip_aug = true
  [[datasets.subsets]]
  image_dir = "dogs"
""")
    data = prepared(toml, validation_split=0.5)
    assert data.default_cache_dir == tmp_path / ".cache"  # beside the TOML
    encoded = data.cache_latents(lambda px: torch.nn.functional.avg_pool2d(px, 8)[:, :1],
                                 "test-vae", to_disk=True)
    assert encoded == len(data.entries) and any((tmp_path / ".cache").iterdir())
    with pytest.raises(ValueError, match="captions change per step"):
        data.final_captions()
    from trainer.run.validation import validation_data

    held = validation_data(data, config(toml, validation_split=0.5))
    captions = [held._batch([i], __import__("random").Random(0)).captions[0]
                for i in range(held.num_images)]
    assert len(captions) == 2 and all(captions)  # no dropout when validating
    with pytest.raises(DatasetError, match=r"cache_text_encoder_outputs is on, but "
                                           r"datasets\[0\].subsets\[0\] changes its captions"):
        prepared(toml, cache_text_encoder_outputs=True)
    with pytest.raises(DatasetError, match=r"datasets\[0\].subsets\[0\].random_crop cannot"):
        prepared(write(tmp_path, "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'cats'\n"
                                 "random_crop = true\n"), cache_latents=True)


def test_alpha_mask_per_subset(tmp_path):
    folders(tmp_path)
    toml = write(tmp_path, "[[datasets]]\n[[datasets.subsets]]\nimage_dir = 'cats'\n"
                           "alpha_mask = true\n[[datasets.subsets]]\nimage_dir = 'dogs'\n")
    data = prepared(toml, training={"masked_loss": True})
    kinds = {e.path.name: m and m.kind for e, m in zip(data.entries, data.masks)}
    assert kinds == {"a.png": "alpha", "b.png": "alpha", "c.png": None}
    with pytest.raises(DatasetError, match="alpha_mask is set but training.masked_loss is off"):
        prepared(toml)


def test_check_dataset_shows_the_toml_dataset(tmp_path):
    from kohya_gui.dataset_check import check_dataset

    folders(tmp_path)
    toml = write(tmp_path, README_FORM)
    text = check_dataset(config(toml, training={"max_train_epochs": 1}))
    # cats 2 + dogs 4 in dataset 0, dogs 1 in dataset 1; 6 reg samples matched in dataset 0
    assert "**4 training images x repeats = 7 samples per epoch**" in text
    assert "plus **6 regularization samples** from 2" in text and "| 128x64 | 1 |" in text
    broken = check_dataset(config(write(tmp_path, "[[datasets]]\nflip = 1\n")))
    # shown as Markdown text: the brackets are escaped so that no link can form
    assert "The dataset cannot be used" in broken and "datasets&#91;0&#93;.flip: unknown key" \
        in broken


def test_two_steps_of_training_from_a_dataset_toml_with_a_reg_subset(tmp_path):
    from trainer.events import ListSink, Started
    from trainer.run.loop import run

    folders(tmp_path / "data")
    toml = write(tmp_path / "data", """
[general]
caption_extension = ".txt"
[[datasets]]
batch_size = 1
resolution = 64
  [[datasets.subsets]]
  image_dir = "cats"
  num_repeats = 2
  flip_aug = true
  [[datasets.subsets]]
  image_dir = "reg"
  is_reg = true
  class_tokens = "an animal"
""")
    cfg = small_config(tmp_path, tmp_path, dataset={"train_data_dir": "", "dataset_config":
                                                    str(toml)},
                       training={"max_train_steps": 2})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    started = sink.of(Started)[0]
    assert (started.num_images, started.num_repeated_images, started.total_steps) == (4, 8, 2)
    assert Path(result.output_path).is_file()


def test_the_advisor_sees_a_subset_folder_change(tmp_path):
    from trainer.advisor.estimate import step_arithmetic

    folders(tmp_path)
    toml = write(tmp_path, '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "cats"\n')
    before = step_arithmetic(config(toml)).images
    picture(tmp_path / "cats" / "new.png", caption="cat, new", shade=60)
    assert (before, step_arithmetic(config(toml)).images) == (2, 3)


def test_color_aug_per_subset_changes_only_that_subsets_pixels_and_refuses_the_cache(tmp_path):
    """sd-scripts reads color_aug per subset (or dataset, or [general]) like flip_aug: the
    images of that subset get a colour draw every step, the others none; the latent cache,
    which would freeze the colours, is refused naming the subset."""
    folders(tmp_path)
    toml = write(tmp_path, """
[[datasets]]
  [[datasets.subsets]]
  image_dir = "cats"
  color_aug = true
  [[datasets.subsets]]
  image_dir = "dogs"
""")
    data = prepared(toml, cache_latents=False)
    colored = {e.path.name: data._color_aug(i) for i, e in enumerate(data.entries)}
    assert colored == {"a.png": True, "b.png": True, "c.png": False}
    with pytest.raises(ValueError, match=r"color_aug in datasets\[0\]\.subsets\[0\] of "
                                         r"dataset\.dataset_config cannot be used with "
                                         r"dataset\.cache_latents"):
        data.cache_latents(lambda px: px[:, :1], "fake", to_disk=False)
    bad = write(tmp_path, "[[datasets]]\ncolor_aug = 3\n  [[datasets.subsets]]\n"
                          "  image_dir = \"cats\"\n")
    with pytest.raises(Exception, match=r"datasets\[0\]\.color_aug"):
        prepared(bad, cache_latents=False)


def test_enable_wildcard_per_subset(tmp_path):
    picture(tmp_path / "wild" / "w.png", caption="a {red|blue} cat\nline two")
    picture(tmp_path / "tame" / "t.png", caption="a {red|blue} dog\nline two")
    toml = write(tmp_path, """
[[datasets]]
  [[datasets.subsets]]
  image_dir = "wild"
  num_repeats = 20
  enable_wildcard = true
  [[datasets.subsets]]
  image_dir = "tame"
  num_repeats = 20
""")
    data = prepared(toml)
    captions = Counter(c for b in data.epoch(1, 1, seed=0) for c in b.captions)
    assert set(captions) == {"a red cat", "a blue cat", "line two", "a {red|blue} dog"}
    assert captions["a {red|blue} dog"] == 20
