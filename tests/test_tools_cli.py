"""The tools on the command line (``python -m trainer <tool>``, through ``trainer.cli.main``):
arguments derived from the options, reports printed, errors as exit statuses; and a round trip
merge -> extract that gives the merged LoRA back."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from tools_helpers import images_folder, random_lora, tiny_tagger

from trainer.cli import main


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    return random_lora(tmp_path_factory.mktemp("cli") / "l.safetensors", seed=5, conv=False)


def update(tensors, name):
    """up @ down * alpha / rank of one module."""
    up = tensors[f"{name}.lora_up.weight"].double().flatten(1)
    down = tensors[f"{name}.lora_down.weight"].double().flatten(1)
    return up @ down * float(tensors[f"{name}.alpha"]) / down.shape[0]


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def test_inspect_prints_the_report_and_json(lora, capsys):
    assert main(["inspect", str(lora)]) == 0
    out = capsys.readouterr().out
    assert "- Type: LoRA" in out and "- Rank: 4; alpha: 2" in out
    assert main(["inspect", str(lora), "--json", "--top-tags", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == "sd1" and report["tags"] == [["red", 2]]
    assert report["metadata"]["ss_network_module"] == "networks.lora"


def test_resize_writes_the_file_and_reports_each_module(lora, tmp_path, capsys):
    out = tmp_path / "r.safetensors"
    assert main(["resize", str(lora), str(out), "--rank", "2", "--precision", "fp16"]) == 0
    printed = capsys.readouterr()
    assert "Frobenius norm kept" in printed.out and "4->2" in printed.out
    assert "resizing" in printed.err  # the progress bar
    tensors, meta = read(out)
    assert meta["ss_network_dim"] == "2"
    assert {t.dtype for t in tensors.values()} == {torch.float16}


def test_bad_options_exit_2_naming_them(lora, tmp_path, capsys):
    out = str(tmp_path / "x.safetensors")
    assert main(["resize", str(lora), out, "--dynamic-method", "sv_fro"]) == 2
    assert "dynamic_param" in capsys.readouterr().err
    assert main(["merge", "base", str(lora), "--weights", "1", "2", "--save-to", out]) == 2
    assert "weights: 2 given for 1 LoRAs" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "none.safetensors")]) == 1
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["resize", str(lora), out, "--dynamic-method", "svd"])  # not a choice


def test_merge_then_extract_gives_the_lora_back(lora, tiny_model_dir, tmp_path, capsys):
    merged, back = tmp_path / "merged", tmp_path / "back.safetensors"
    assert main(["merge", str(tiny_model_dir), str(lora), "--save-folder", str(merged),
                 "--precision", "fp32"]) == 0
    assert f"Wrote {merged}" in capsys.readouterr().out
    assert main(["extract", str(tiny_model_dir), str(merged), str(back), "--rank", "4",
                 "--min-diff", "0", "--precision", "fp32"]) == 0
    assert "Extracted" in capsys.readouterr().out
    original, extracted = read(lora)[0], read(back)[0]
    names = {k.split(".")[0] for k in original}
    assert names == {k.split(".")[0] for k in extracted}
    for name in names:
        torch.testing.assert_close(update(extracted, name), update(original, name), atol=2e-5,
                                   rtol=0)


def test_tag_a_folder(tmp_path, capsys):
    folder = images_folder(tmp_path / "imgs")
    model = tiny_tagger(tmp_path / "tagger")
    assert main(["tag", str(folder), str(model), "--exclude-tags", "long_hair", "^_^",
                 "--no-underscores-to-spaces", "--caption-extension", ".tags"]) == 0
    assert "3 captions written" in capsys.readouterr().out
    assert (folder / "img0.tags").read_text().strip() == "red_theme"
    assert (folder / "img2.tags").read_text().strip() == ""
