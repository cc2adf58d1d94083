"""Edit training's control images in the latent cache (memory, disk, lazy: the same keys and
invalidation as the targets'), in the step (encoded like the targets when not cached), and
from musubi-tuner's and sd-scripts' dataset TOML (issue 33)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from control_helpers import FAMILY, FakeVAE, as_edit_family, inverted, noise, pairs, prepare
from PIL import Image
from safetensors.torch import load_file

from trainer.config import files as config_io
from trainer.data import DatasetError, prepare_dataset
from trainer.data.dataset_toml import load_dataset_toml, read_toml


def cache_files(train: Path) -> list[Path]:
    return sorted((train / ".cache").glob("*.safetensors"))


def test_control_latents_are_cached_beside_the_targets_in_memory(tmp_path, monkeypatch):
    as_edit_family(monkeypatch, max=2, required=1)
    train = pairs(tmp_path)
    noise(train / "control" / "a_1.png", (160, 128), 9)  # a second reference for a
    vae, data = FakeVAE(), prepare(train, cache_latents=True, flip_aug=True)
    assert data.cache_latents(vae, "v", to_disk=False) == 3
    assert vae.images == 2 * (3 + 4)  # 3 targets and 4 controls, each with its mirror
    assert not (train / ".cache").exists()
    plain = prepare(train, flip_aug=False)
    by_name = {b.paths[0].name: b for b in plain.epoch(0, 1, seed=0)}
    for batch in data.epoch(0, 1, seed=0):
        reference = by_name[batch.paths[0].name]
        count = 2 if batch.paths[0].name == "a.png" else 1
        assert len(batch.controls) == count == len(reference.control_pixels)
        for cached, pixels in zip(batch.controls, reference.control_pixels):
            if not torch.allclose(batch.latents, FakeVAE()(reference.pixels), atol=1e-5):
                pixels = pixels.flip(-1)  # this step drew the mirror: its controls are too
            assert torch.allclose(cached, FakeVAE()(pixels), atol=1e-5)


def test_control_latents_on_disk_are_reused_and_invalidated_like_the_targets(tmp_path,
                                                                            monkeypatch):
    as_edit_family(monkeypatch, max=2, required=0)
    train = pairs(tmp_path)

    def run(**dataset) -> int:
        return prepare(train, cache_latents=True, cache_latents_to_disk=True,
                       **dataset).cache_latents(FakeVAE(), "v", to_disk=True)

    assert run() == 3
    stored = [load_file(p) for p in cache_files(train)]
    assert [set(s) for s in stored] == [{"latent", "control_0"}] * 3
    assert run() == 0  # the next run reads them
    inverted(train / "3_edit" / "b.png", train / "control" / "b.png")  # the same bytes
    assert run() == 0
    Image.new("RGB", (160, 128), (9, 9, 9)).save(train / "control" / "a.png")  # new pixels
    assert run() == 1
    noise(train / "control" / "c_1.png", (128, 128), 4)  # another reference
    assert run() == 1
    (train / "control" / "b.png").unlink()  # optional: b trains alone, a new key
    assert run() == 1
    assert run(flip_aug=True) == 3  # the mirrors too, controls included
    assert any("control_0_flipped" in load_file(p) for p in cache_files(train))
    victim = next(p for p in cache_files(train) if "control_1" in load_file(p))
    with_controls = load_file(victim)
    del with_controls["control_1"]  # a file that lacks a control is encoded again
    from safetensors.torch import save_file

    save_file(with_controls, victim, metadata={"key": victim.stem})
    assert run(flip_aug=True) == 1


def test_a_lazy_cache_encodes_a_target_and_its_controls_when_first_needed(tmp_path,
                                                                        monkeypatch):
    as_edit_family(monkeypatch, max=1, required=1)
    train = pairs(tmp_path)
    vae, data = FakeVAE(), prepare(train, cache_latents=True)
    assert data.cache_latents(vae, "v", to_disk=False, lazy=True) == 3
    assert vae.images == 0
    batch = next(data.epoch(0, 1, seed=0))
    assert vae.images == 2  # one target and its control
    assert torch.allclose(batch.controls[0], -batch.latents, atol=1e-5)


def test_the_step_encodes_uncached_controls_like_the_targets():
    from trainer.run.step import control_latents

    family = SimpleNamespace(encode_latents=lambda vae, px: px[:, :, ::8, ::8] * 2)
    pixels = [torch.rand(2, 3, 16, 24), torch.rand(2, 3, 32, 8)]
    batch = SimpleNamespace(controls=None, control_pixels=pixels)
    model = SimpleNamespace(vae=None)
    out = control_latents(batch, model, family, torch.device("cpu"), torch.float64)
    assert [o.shape for o in out] == [(2, 3, 2, 3), (2, 3, 4, 1)]
    assert out[0].dtype == torch.float64
    assert torch.allclose(out[1], pixels[1][:, :, ::8, ::8].double() * 2)
    cached = SimpleNamespace(controls=[torch.ones(2, 4, 2, 2)], control_pixels=None)
    [latents] = control_latents(cached, model, family, torch.device("cpu"), torch.float16)
    assert latents.dtype == torch.float16 and torch.equal(latents.float(), torch.ones(2, 4, 2, 2))
    none = SimpleNamespace(controls=None, control_pixels=None)
    assert control_latents(none, model, family, torch.device("cpu"), torch.float32) == []


def test_the_step_hands_the_controls_to_the_familys_predict():
    """The hook an edit family implements: ``predict(..., controls=[...])``, one latent tensor
    per reference index; a batch without controls calls predict as before."""
    from trainer.config import TrainConfig
    from trainer.run.step import batch_loss

    seen = []

    def predict(model, noisy, t, text, size_ids, **extra):
        seen.append(extra)
        return noisy * 0
    family = SimpleNamespace(predict=predict)
    objective = SimpleNamespace(
        sample_noise=torch.zeros_like, sample_t=lambda x: torch.zeros(x.shape[0]),
        noisy=lambda x, n, t: x, prediction=lambda p, x, t: p, target=lambda x, n, t: x,
        weights=lambda w, t: w, huber_c=lambda t: None)
    latents = torch.ones(2, 4, 2, 2)
    control = torch.full((2, 4, 2, 2), 3.0)
    for controls in ([control], None):
        batch = SimpleNamespace(latents=latents, controls=controls, control_pixels=None,
                                text=torch.zeros(2, 1), size_ids=None,
                                loss_weights=torch.ones(2), mask=None)
        loss = batch_loss(batch, SimpleNamespace(), TrainConfig(), torch.device("cpu"),
                          torch.float32, family, objective)
        assert torch.isclose(loss, torch.tensor(1.0))
    assert len(seen) == 2 and torch.equal(seen[0]["controls"][0], control) and seen[1] == {}


MUSUBI = """
[general]
resolution = [128, 128]
batch_size = 1
enable_bucket = true
qwen_image_edit_no_resize_control = true

[[datasets]]
image_directory = "train/3_edit"
control_directory = "train/control"
control_resolution = [64, 64]
"""


def toml_config(toml: Path):
    return config_io.from_dict({"mode": "lora", "dataset": {
        "dataset_config": str(toml), "min_bucket_reso": 64, "max_bucket_reso": 256,
        "bucket_reso_steps": 32, "cache_latents": False}, "training": {"train_batch_size": 1}})


def test_musubi_control_fields_import(tmp_path, monkeypatch):
    train = pairs(tmp_path)
    toml = tmp_path / "dataset.toml"
    toml.write_text(MUSUBI)
    raw = read_toml(toml)
    assert raw["datasets"][0]["subsets"] == [{"image_dir": "train/3_edit",
                                              "control_directory": "train/control"}]
    assert raw["general"]["no_resize_control"] is True  # the older name, read as the new
    [subset] = load_dataset_toml(toml, toml_config(toml)).subsets
    assert subset.options.control_dir == train / "control"
    assert subset.options.control_resolution == [64, 64]
    assert subset.options.no_resize_control is True
    as_edit_family(monkeypatch, max=1, required=1, multiple=16)
    data = prepare_dataset(toml_config(toml), lambda _: None)
    for batch in data.epoch(0, 1, seed=0):  # no resize, at most 64x64's area, sides on 16
        [controls] = batch.control_pixels
        assert controls.shape[-2] * controls.shape[-1] <= 64 * 64
        assert controls.shape[-1] % 16 == 0 and controls.shape[-2] % 16 == 0


def test_sd_scripts_subsets_take_a_control_directory(tmp_path, monkeypatch):
    pairs(tmp_path)
    toml = tmp_path / "dataset.toml"
    toml.write_text("[[datasets]]\nresolution = 128\n[[datasets.subsets]]\n"
                    "image_dir = 'train/3_edit'\ncontrol_directory = 'train/control'\n")
    as_edit_family(monkeypatch, max=1, required=1)
    data = prepare_dataset(toml_config(toml), lambda _: None)
    assert [s.images[0].path.name for s in data.controls] == ["a.png", "b.png", "c.png"]
    batch = next(data.epoch(0, 1, seed=0))
    assert torch.allclose(batch.control_pixels[0], -batch.pixels, atol=1e-6)
    toml.write_text("[general]\ncontrol_directory = 'train/control'\n[[datasets]]\n"
                    "[[datasets.subsets]]\nimage_dir = 'train/3_edit'\n")
    with pytest.raises(DatasetError, match=r"general.control_directory: a per-subset option"):
        prepare_dataset(toml_config(toml), lambda _: None)


def test_toml_controls_are_refused_for_a_family_that_takes_none(tmp_path):
    pairs(tmp_path)
    toml = tmp_path / "dataset.toml"
    toml.write_text(MUSUBI)
    with pytest.raises(DatasetError) as info:
        prepare_dataset(toml_config(toml), lambda _: None)  # the embedded SD 1.x model
    [line] = info.value.problems
    assert f"dataset.dataset_config ({toml}): datasets[0].subsets[0].control_directory is " \
           f"set but" in line and "is not an edit model" in line
    assert FAMILY == "sd1"
