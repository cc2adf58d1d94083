"""bench/edit_sample_grid.py's own logic (the bench itself trains a tiny edit LoRA from the CLI):
its rows are the edit preset's captions with their controls and targets, its config samples
each with its control at the last step, and a grid is control | target | sample."""

import sys

import tomllib
from PIL import Image

from trainer.config.files import load
from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
import edit_sample_grid as bench  # noqa: E402

PRESET = PROJECT_ROOT / "presets" / "lora" / "tiny-flux-kontext.toml"


def test_the_rows_are_the_captions_with_their_controls_and_the_config_samples_them(tmp_path):
    cfg = load(PRESET, [])
    rows = bench.dataset_rows(cfg, 2)
    assert len(rows) == 2
    for caption, control, target in rows:
        assert control.stem == target.stem and control.parent != target.parent
        assert target.with_suffix(".txt").read_text().strip() == caption
        assert bench.target_of(cfg, caption) == target
    assert bench.target_of(cfg, "no such caption") is None
    path, step = bench.write_config(PRESET, tmp_path, rows, 3, 2, 5)
    raw = tomllib.loads(path.read_text())
    assert step == 3 and raw["sampling"]["sample_every_n_steps"] == 3
    assert raw["sampling"]["sample_prompts"][0] == f"{rows[0][0]} --ci {rows[0][1]} --d 5 --s 2"
    assert load(path, []).saving.output_dir == str(tmp_path / "run")


def test_a_grid_is_control_target_and_sample(tmp_path):
    colours = {"control": (200, 20, 20), "sample": (20, 200, 20)}
    paths = {}
    for name, colour in colours.items():
        paths[name] = tmp_path / f"{name}.png"
        Image.new("RGB", (32, 32), colour).save(paths[name])
    out = bench.grid(("make it green", paths["control"], None), paths["sample"], 4,
                     tmp_path / "grid.png")
    with Image.open(out) as img:
        grid = img.convert("RGB")
    middle = bench.GAP + bench.LABEL + bench.CELL // 2
    cells = [bench.GAP + bench.CELL // 2 + i * (bench.CELL + bench.GAP) for i in range(3)]
    assert [grid.getpixel((x, middle)) for x in cells] == [colours["control"], (90, 90, 90),
                                                           colours["sample"]]
