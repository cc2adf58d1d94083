"""Check dataset for an edit model (FLUX.1 Kontext's tiny twin): per concept folder the targets
with their controls, those without, the targets missing one where the family needs one, the
control files that match no target, and some pairs as thumbnails with their caption; nothing of
it for a model that takes no control images. The pairing is the run's
(trainer/data/controls.py), read even when the dataset has problems."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PIL import Image

from kohya_gui.dataset_check import check_dataset
from trainer.config import TrainConfig
from trainer.config import files as config_io
from trainer.families import FAMILIES
from trainer.families.spec import ControlSpec

KONTEXT = "embedded:tiny-flux-kontext"
THUMB = "](data:image/jpeg;base64,"


def image(path: Path, caption: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), (30 * len(path.stem) % 255, 90, 160)).save(path)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)
    return path


def dataset(root: Path, orphans: bool = True, references: int = 2) -> Path:
    """2_day: a (control in its concept's subfolder), b (numbered references), c (none);
    1_night: d (control at the control folder's root); orphans in both places."""
    train = root / "train"
    for name in "abc":
        image(train / "2_day" / f"{name}.png", f"make {name} night | <b>dark</b>")
    image(train / "1_night" / "d.png", "make d day")
    image(train / "control" / "2_day" / "a.png")
    for i in range(references):
        image(train / "control" / "2_day" / f"b_{i}.png")
    image(train / "control" / "d.png")
    if orphans:
        image(train / "control" / "2_day" / "zzz.png")
        image(train / "control" / "stray.png")
    return train


def config(train: Path, model: str = KONTEXT, control_dir: str | None = "control"
           ) -> TrainConfig:
    dataset = {"train_data_dir": str(train), "resolution": 64, "min_bucket_reso": 64,
               "max_bucket_reso": 128, "bucket_reso_steps": 16}
    if control_dir is not None:
        dataset["control_dir"] = control_dir
    return config_io.from_dict({"model": {"pretrained_model_name_or_path": model},
                                "dataset": dataset,
                                "training": {"max_train_epochs": 1, "log_with": "none"}})


def row(text: str, concept: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {concept} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_pairs_orphans_and_thumbnails_of_an_edit_dataset(tmp_path):
    text = check_dataset(config(dataset(tmp_path)))
    # the orphans are problems of the run: the check says so, and still shows the pairs
    assert "**The dataset cannot be used:**" in text and "zzz.png" in text
    assert ("**Image pairs (FLUX.1 Kontext): 3 of 4 target(s) with their controls, 0 missing, "
            "2 orphan control(s)**") in text, text
    assert row(text, "2_day")[1:] == ["3", "2", "1", "1"]
    assert row(text, "1_night")[1:] == ["1", "1", "0", "0"]
    assert row(text, "(control folder)")[1:] == ["0", "0", "0", "1"]
    orphans = text.split("Control images that match no target:")[1]
    assert "zzz.png" in orphans and "stray.png" in orphans
    assert "Targets missing a control" not in text  # optional for Kontext
    gallery = text.split("| target | controls | caption |")[1].strip().splitlines()[1:]
    assert len(gallery) == 3  # a, b, d: the targets that have controls
    b = next(line for line in gallery if "make b night" in line)
    assert b.count(THUMB) == 3 and "![b_0.png" in b and "![b_1.png" in b  # target + 2 references
    assert "&#124;" in b and "&lt;b&gt;dark" in b and "<b>" not in b  # caption shown as text


def test_a_clean_edit_dataset_checks_and_shows_its_pairs(tmp_path):
    text = check_dataset(config(dataset(tmp_path, orphans=False, references=1)))
    assert "cannot be used" not in text and "steps**" in text
    assert "3 of 4 target(s) with their controls, 0 missing, 0 orphan control(s)" in text
    assert "a control is optional for FLUX.1 Kontext, up to 1" in text


def test_targets_missing_a_control_where_the_family_needs_one(tmp_path, monkeypatch):
    name = "flux1_kontext"
    monkeypatch.setitem(FAMILIES, name, replace(FAMILIES[name], controls=ControlSpec(
        max=2, required=1)))
    text = check_dataset(config(dataset(tmp_path, orphans=False)))
    assert "3 of 4 target(s) with their controls, 1 missing, 0 orphan control(s)" in text
    assert "FLUX.1 Kontext needs 1 control(s) per target" in text
    missing = text.split("Targets missing a control:")[1].split("\n\n")[0]
    assert "c.png" in missing and "a.png" not in missing


def test_an_edit_model_without_a_control_folder_is_told_to_set_one(tmp_path):
    text = check_dataset(config(dataset(tmp_path, orphans=False, references=1), control_dir=None))
    assert "**Image pairs (FLUX.1 Kontext):** no control folder is set" in text
    assert "dataset.control_dir" in text
    gone = check_dataset(config(tmp_path / "train", control_dir="nowhere"))
    assert "**Image pairs (FLUX.1 Kontext):**" in gone and "does not exist" in gone


def test_no_pairs_for_a_model_that_takes_no_controls(tmp_path):
    train = dataset(tmp_path)
    for model in ("embedded:tiny-sd15", "embedded:tiny-flux"):
        text = check_dataset(config(train, model, control_dir=None))
        assert "Image pairs" not in text and "steps**" in text, model


def test_a_dataset_toml_subsets_control_directory_is_paired_too(tmp_path):
    """musubi-tuner's control_directory of a dataset TOML subset: the same pairing, per
    subset; a subset without one has no pairs to count."""
    train = dataset(tmp_path, orphans=False, references=1)
    toml = tmp_path / "dataset.toml"
    toml.write_text("[general]\nresolution = 64\n[[datasets]]\n"
                    "[[datasets.subsets]]\nimage_dir = 'train/2_day'\n"
                    "control_directory = 'train/control/2_day'\n"
                    "[[datasets.subsets]]\nimage_dir = 'train/1_night'\n")
    cfg = config_io.from_dict({"model": {"pretrained_model_name_or_path": KONTEXT},
                               "dataset": {"dataset_config": str(toml), "min_bucket_reso": 64,
                                           "max_bucket_reso": 128, "bucket_reso_steps": 16},
                               "training": {"max_train_epochs": 1, "log_with": "none"}})
    text = check_dataset(cfg)
    assert "cannot be used" not in text, text
    assert "2 of 3 target(s) with their controls, 0 missing, 0 orphan control(s)" in text
    assert row(text, "2_day")[1:] == ["3", "2", "1", "0"]
    assert "| 1_night |" not in text and train.is_dir()
