"""The Utilities tab's handlers, called as the page calls them: with ``{option: value}`` as the
generated components send them (numbers as floats, unset numbers as None, unset choices as
"(unset)", optional numbers as text, lists as text)."""

from __future__ import annotations

import pandas as pd
import pytest
from PIL import Image
from tools_helpers import images_folder, random_lora, tiny_tagger

from kohya_gui.tabs import tool_handlers as h
from kohya_gui.tabs.tool_forms import UNSET, raw_values
from trainer.tools.options import MergeOptions, ResizeOptions, TagOptions


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    return random_lora(tmp_path_factory.mktemp("gui") / "l.safetensors", seed=2)


def test_form_values_become_options():
    got = raw_values(ResizeOptions, {"path": " a.safetensors ", "save_to": "b.safetensors",
                                     "rank": 8.0, "conv_rank": "", "dynamic_method": UNSET,
                                     "dynamic_param": " ", "precision": "fp16"})
    assert got == {"path": "a.safetensors", "save_to": "b.safetensors", "rank": 8,
                   "precision": "fp16"}
    got = raw_values(MergeOptions, {"loras": "a.safetensors\n\n b.safetensors \n",
                                    "weights": "0.5, 1  -0.25", "save_to": ""})
    assert got == {"loras": ["a.safetensors", "b.safetensors"], "weights": [0.5, 1.0, -0.25]}
    assert raw_values(TagOptions, {"exclude_tags": "long_hair, ^_^,"}) == {
        "exclude_tags": ["long_hair", "^_^"]}


def test_inspect_shows_the_report_the_norms_and_the_metadata(lora):
    text, norms, meta = h.inspect_tool({"path": str(lora), "top_tags": 20.0})
    assert "- Type: LoRA with 3x3 convolutions (LoCon)" in text and "red (2)" in text
    assert list(norms.columns) == h.NORM_COLUMNS and len(norms) > 10
    assert set(norms["part"]) == {"UNet", "text encoder"} and (norms["norm"] > 0).all()
    assert meta["ss_steps"] == "7"
    text, norms, meta = h.inspect_tool({"path": "", "top_tags": 20.0})
    assert text.startswith("**Problems:**") and "path" in text and norms.empty and meta == {}


def test_resize_from_the_form(lora, tmp_path):
    out = tmp_path / "small.safetensors"
    values = {"path": str(lora), "save_to": str(out), "rank": 2.0, "conv_rank": "",
              "dynamic_method": UNSET, "dynamic_param": "", "precision": UNSET}
    calls = []
    text, table = h.resize_tool(values, lambda *a: calls.append(a))
    assert out.is_file() and f"Wrote **{out}**" in text and "network dim 2" in text
    assert list(table.columns) == h.RESIZE_COLUMNS and set(table["rank"]) == {"4 -> 2"}
    assert calls[-1][0] == calls[-1][1] == len(table)
    text, table = h.resize_tool({**values, "dynamic_method": "sv_fro"})
    assert "dynamic_param" in text and table.empty
    text, _ = h.resize_tool({**values, "conv_rank": "0"})  # a 0 is a value, and refused
    assert "conv_rank: Input should be greater than or equal to 1" in text
    text, _ = h.resize_tool({**values, "dynamic_method": "sv_ratio", "dynamic_param": "4"})
    assert "network dim Dynamic" in text


def test_merge_from_the_form(lora, tiny_model_dir, tmp_path):
    out = tmp_path / "m.safetensors"
    values = {"base": str(tiny_model_dir), "config_dir": "", "loras": f"{lora}\n{lora}",
              "weights": "0.5, 0.25", "save_to": str(out), "save_folder": "",
              "precision": "fp16"}
    text = h.merge_tool(values)
    assert out.is_file() and f"Wrote {out}" in text and "x 0.25" in text
    assert "weights: 1 given for 2 LoRAs" in h.merge_tool({**values, "weights": "1"})
    missing = h.merge_tool({**values, "base": str(tmp_path / "none")})
    assert missing.startswith("**Error:**") and "no such file or folder" in missing


def test_tag_from_the_form(tmp_path):
    folder = images_folder(tmp_path / "imgs")
    values = {"folder": str(folder), "model_dir": str(tiny_tagger(tmp_path / "t")),
              "prefix": "sks", "suffix": "", "overwrite": False, "caption_extension": ".txt",
              "recursive": False, "batch_size": 4.0, "general_threshold": 0.35,
              "character_threshold": 0.85, "exclude_tags": "long_hair, ^_^",
              "underscores_to_spaces": True, "character_tags_first": False, "rating": False}
    text = h.tag_tool(values)
    assert "3 captions written" in text
    assert (folder / "img1.txt").read_text().strip() == "sks, blue theme"


def test_the_caption_editor_round_trip(tmp_path):
    folder = images_folder(tmp_path / "imgs")
    (folder / "img0.txt").write_text("red, circle")
    frame, tags, message = h.load_editor(str(folder), ".txt", False)
    assert list(frame["image"]) == ["img0.png", "img1.png", "img2.png"]
    assert frame["thumbnail"][0].startswith("![img0.png](data:image/jpeg;base64,")
    assert message == "3 images, 2 without a caption"
    assert tags.values.tolist() == [["circle", 1], ["red", 1]]
    frame.loc[1, "caption"] = "blue, circle"
    message, tags = h.save_editor(str(folder), ".txt", frame)
    assert message == "Saved 1 changed caption(s)."
    assert (folder / "img1.txt").read_text() == "blue, circle\n"
    assert tags.values.tolist()[0] == ["circle", 2]
    bad = pd.DataFrame([["", "../x.png", "x"]], columns=h.EDITOR_COLUMNS)
    assert h.save_editor(str(folder), ".txt", bad)[0].startswith("**Error:**")
    assert h.load_editor(str(tmp_path / "none"), ".txt", False)[2].startswith("**Error:**")


def test_the_caption_editor_shows_each_image_beside_its_controls(tmp_path):
    """Instruction captions of edit pairs: with a control folder, each image's controls (paired
    as the run pairs them: the concept's subfolder first, numbered references in order) are
    drawn beside it, and the captions save as before."""
    folder = images_folder(tmp_path / "train" / "10_edit")
    (folder / "img0.txt").write_text("make it red")
    controls = tmp_path / "train" / "control"
    images_folder(controls / "10_edit", sizes=((16, 16),) * 3)  # img0..img2: one each
    Image.new("RGB", (8, 8)).save(controls / "10_edit" / "img1_1.png")  # img1's 2nd reference
    Image.new("RGB", (8, 8)).save(controls / "stray.png")  # matches no image
    (controls / "10_edit" / "img2.png").unlink()
    frame, _, message = h.load_editor(str(folder), ".txt", False, "../control")
    assert list(frame.columns) == h.PAIR_COLUMNS
    assert list(frame["image"]) == ["img0.png", "img1.png", "img2.png"]
    shown = [cell.count("](data:image/jpeg;base64,") for cell in frame["controls"]]
    assert shown == [1, 2, 0]
    assert frame["controls"][1].index("![img1.png") < frame["controls"][1].index("![img1_1.png")
    assert message == ("3 images, 2 without a caption; 2 with control images, "
                       "1 control image(s) matching no image")
    table = h.editor_table(frame)  # thumbnails are images, only the caption is editable
    assert table.datatype == ["markdown", "markdown", "str", "str"]
    assert table.static_columns == [0, 1, 2]
    frame.loc[1, "caption"] = "make it blue"
    assert h.save_editor(str(folder), ".txt", frame)[0] == "Saved 1 changed caption(s)."
    assert (folder / "img1.txt").read_text() == "make it blue\n"
    assert h.save_editor(str(folder), ".txt", frame.values.tolist())[0].startswith("Saved 0")
    missing = h.load_editor(str(folder), ".txt", False, str(tmp_path / "none"))
    assert missing[2].startswith("**Error:**") and "control_dir" in missing[2]
    plain, _, _ = h.load_editor(str(folder), ".txt", False, "")
    assert list(plain.columns) == h.EDITOR_COLUMNS
