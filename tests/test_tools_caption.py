"""Captioning a folder: a tiny random BLIP through transformers' pipeline (the files written are
checked, not the words), a tiny WD14-style ONNX tagger whose graph the test writes (so the tags
are known), and the caption editor's file logic."""

from __future__ import annotations

import pytest
from PIL import Image
from tools_helpers import images_folder, tiny_blip, tiny_tagger

from trainer.tools.caption import caption_with_model, tag_with_tagger
from trainer.tools.caption_table import read_rows, save_rows, tag_counts, thumbnail_uri
from trainer.tools.common import ToolError
from trainer.tools.options import CaptionOptions, OptionsError, TagOptions, validate


@pytest.fixture(scope="module")
def blip(tmp_path_factory):
    return tiny_blip(tmp_path_factory.mktemp("blip"))


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    return tiny_tagger(tmp_path_factory.mktemp("tagger"))


def test_a_model_captions_the_folder_and_keeps_existing_captions(blip, tmp_path):
    folder = images_folder(tmp_path / "imgs")
    (folder / "img1.txt").write_text("my own caption")
    seen = []
    report = caption_with_model(
        CaptionOptions(folder=str(folder), model_dir=str(blip), prefix="sks", suffix="photo",
                       max_new_tokens=5, batch_size=2),
        progress=lambda done, total, what: seen.append((done, total)))
    assert sorted(report.written) == [str(folder / "img0.png"), str(folder / "img2.png")]
    assert report.kept == [str(folder / "img1.png")] and not report.failed
    assert (folder / "img1.txt").read_text() == "my own caption"
    for name in ("img0", "img2"):
        text = (folder / f"{name}.txt").read_text(encoding="utf-8")
        assert text.startswith("sks, ") and text.endswith(", photo\n")
    assert seen[0] == (0, 2) and seen[-1] == (2, 2)


def test_overwrite_and_another_extension(blip, tmp_path):
    folder = images_folder(tmp_path / "imgs")
    (folder / "img1.caption").write_text("old")
    report = caption_with_model(CaptionOptions(
        folder=str(folder), model_dir=str(blip), overwrite=True, caption_extension=".caption",
        max_new_tokens=3))
    assert len(report.written) == 3 and report.kept == []
    assert (folder / "img1.caption").read_text() != "old"
    assert not list(folder.glob("*.txt"))


def test_the_tagger_writes_the_tags_its_graph_gives(tagger, tmp_path):
    folder = images_folder(tmp_path / "imgs")  # red (wide), blue, green (tall)
    tag_with_tagger(TagOptions(folder=str(folder), model_dir=str(tagger), prefix="sks",
                               batch_size=2))
    read = {p.stem: p.read_text().strip() for p in folder.glob("*.txt")}
    # general tags, most likely first: ^_^ (0.99; 3 characters: no underscore change), a
    # colour theme when the image's mean (white padding included) is strongly red or blue
    # (0.96, 0.88), long hair (0.5); the character (0.6) is below the threshold of 0.85
    assert read["img0"] == "sks, ^_^, red theme, long hair"
    assert read["img1"] == "sks, ^_^, blue theme, long hair"
    assert read["img2"] == "sks, ^_^, long hair"


def test_tagger_thresholds_exclusions_and_order(tagger, tmp_path):
    folder = images_folder(tmp_path / "imgs", colors=[(220, 30, 30)], sizes=[(16, 16)])
    tag_with_tagger(TagOptions(
        folder=str(folder), model_dir=str(tagger), general_threshold=0.6,
        character_threshold=0.5, character_tags_first=True, rating=True,
        exclude_tags=["red_theme"], underscores_to_spaces=False))
    assert (folder / "img0.txt").read_text().strip() == "general, hatsune_miku, ^_^"


def test_a_fixed_batch_tagger_runs_image_by_image(tmp_path):
    model = tiny_tagger(tmp_path / "fixed", batch=1)
    folder = images_folder(tmp_path / "imgs")
    report = tag_with_tagger(TagOptions(folder=str(folder), model_dir=str(model),
                                        batch_size=3))
    assert len(report.written) == 3


def test_folder_and_model_problems_are_named(tagger, tmp_path):
    with pytest.raises(ToolError, match="no such folder"):
        tag_with_tagger(TagOptions(folder=str(tmp_path / "none"), model_dir=str(tagger)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ToolError, match="no .png"):
        tag_with_tagger(TagOptions(folder=str(empty), model_dir=str(tagger)))
    folder = images_folder(tmp_path / "imgs")
    with pytest.raises(ToolError, match="no model.onnx"):
        tag_with_tagger(TagOptions(folder=str(folder), model_dir=str(tmp_path)))
    with pytest.raises(ToolError, match="no config.json"):
        caption_with_model(CaptionOptions(folder=str(folder), model_dir=str(tmp_path)))
    with pytest.raises(OptionsError, match="general_threshold"):
        validate(TagOptions, {"folder": "f", "model_dir": "m", "general_threshold": 1.5})
    with pytest.raises(OptionsError, match="caption_extension"):
        validate(TagOptions, {"folder": "f", "model_dir": "m", "caption_extension": "txt"})


def test_the_caption_editor_reads_counts_and_saves_only_changes(tmp_path):
    folder = images_folder(tmp_path / "imgs")
    (folder / "sub").mkdir()
    Image.new("RGB", (8, 8)).save(folder / "sub" / "deep.png")
    (folder / "img0.txt").write_text("sks, Red, circle\n")
    (folder / "img1.txt").write_text("sks, blue")
    rows = read_rows(folder, ".txt")
    assert rows == [("img0.png", "sks, Red, circle"), ("img1.png", "sks, blue"),
                    ("img2.png", "")]
    assert read_rows(folder, ".txt", recursive=True)[-1] == ("sub/deep.png", "")
    assert tag_counts([c for _, c in rows]) == [("sks", 2), ("blue", 1), ("circle", 1),
                                                 ("red", 1)]
    before = (folder / "img1.txt").stat().st_mtime_ns
    changed = save_rows(folder, [("img0.png", "sks, red"), ("img1.png", "sks, blue"),
                                 ("img2.png", "  a  green\nsquare ")], ".txt")
    assert changed == 2 and (folder / "img1.txt").stat().st_mtime_ns == before
    assert (folder / "img2.txt").read_text() == "a green square\n"
    with pytest.raises(ToolError, match="not an image of"):
        save_rows(folder, [("../outside.png", "x")], ".txt")
    assert thumbnail_uri(folder / "img0.png").startswith("data:image/jpeg;base64,")
