"""Issue 21: a non-square base resolution, dataset.resolution = [width, height] (sd-scripts'
--resolution W,H and its dataset TOML's resolution = [w, h]; kohya_ss's max_resolution "W,H").
The expected sizes are worked out here from sd-scripts' rules: without buckets every image is
W x H (latents W/8 x H/8); with buckets no bucket's area passes W * H; ss_resolution is the
text of the tuple (W, H), modelspec.resolution "WxH"."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.config.files import ConfigError, from_dict
from trainer.config.sections.resolution import area_side, base_size, scaled
from trainer.data.dataset import prepare_dataset
from trainer.importers.kohya import import_kohya
from trainer.run.loop import run


def test_the_schema_takes_a_side_a_pair_or_kohya_text():
    def reso(value):
        return from_dict({"dataset": {"resolution": value}}).dataset.resolution

    assert reso(512) == 512 and reso([512, 768]) == [512, 768]
    assert reso("512,768") == [512, 768] and reso("512x768") == [512, 768]
    for bad, words in (([512, 770], "multiple of 8"), ([512, 768, 8], "[width, height]"),
                       ([32, 64], ">= 64"), ("wide", "integer")):
        with pytest.raises(ConfigError, match=r"dataset\.resolution") as exc:
            reso(bad)
        assert words in str(exc.value)


def test_helpers_keep_width_and_height_apart():
    assert base_size(512) == (512, 512) and base_size([512, 768]) == (512, 768)
    assert area_side([512, 768]) == int((512 * 768) ** 0.5)
    assert scaled([512, 768], 3 / 4) == [384, 576] and scaled(512, 3 / 4) == 384


def test_buckets_off_every_image_is_w_by_h_and_on_no_bucket_passes_the_area(tmp_path):
    data = one_image_dataset(tmp_path / "data", size=(80, 80))
    off = small_config(tmp_path, data, dataset={"resolution": [64, 128], "enable_bucket": False})
    assert prepare_dataset(off, warn=print).bucket_table() == {"64x128": 1}
    on = small_config(tmp_path, data, dataset={"resolution": [64, 128], "enable_bucket": True,
                                               "bucket_reso_steps": 8, "min_bucket_reso": 64,
                                               "max_bucket_reso": 256})
    (name,) = prepare_dataset(on, warn=print).bucket_table()
    width, height = (int(s) for s in name.split("x"))
    assert width * height <= 64 * 128 and width == height  # a square image: a square bucket
    assert width * height > 64 * 64  # the area is 64 x 128's, not a 64 px square's


def test_kohya_max_resolution_and_the_flag_import_as_the_pair():
    cfg, report = import_kohya({"LoRA_type": "Standard", "max_resolution": "512,768"})
    assert cfg.dataset.resolution == [512, 768]
    assert not report.unsupported and not report.notes
    cfg, report = import_kohya({"LoRA_type": "Standard",
                                "additional_parameters": "--resolution 768,512"})
    assert cfg.dataset.resolution == [768, 512] and not report.unsupported


def test_advice_keeps_the_aspect_ratio():
    from trainer.advisor.rules import _lower_resolution
    from trainer.run.failures import memory_advice

    cfg = from_dict({"dataset": {"resolution": [768, 1024]}})
    assert _lower_resolution(cfg, None, "fp32") == {"dataset.resolution": [576, 768]}
    assert "dataset.resolution = [576, 768]" in memory_advice(cfg)  # 256 px off 1024, 3/4


def _metadata(path: str) -> dict[str, str]:
    with safe_open(path, "pt") as f:
        return f.metadata()


def test_two_steps_at_64x128_write_the_base_as_sd_scripts(tmp_path):
    data = one_image_dataset(tmp_path / "data", size=(64, 128))
    cfg = small_config(tmp_path, data, training={"max_train_steps": 2},
                       dataset={"resolution": [64, 128], "enable_bucket": False},
                       sampling={"sample_prompts": ["a red circle"],
                                 "sample_every_n_steps": 2, "sample_steps": 1})
    result = run(cfg)
    assert result.status == "finished", result.error
    meta = _metadata(result.output_path)
    assert meta["ss_resolution"] == "(64, 128)" and meta["modelspec.resolution"] == "64x128"
    buckets = json.loads(meta["ss_bucket_info"])["buckets"]
    assert [b["resolution"] for b in buckets.values()] == [[64, 128]]
    samples = sorted((tmp_path / "out").rglob("*.png"))
    assert samples, "no sample image"
    from PIL import Image

    assert Image.open(samples[-1]).size == (64, 128)  # the base's width and height

