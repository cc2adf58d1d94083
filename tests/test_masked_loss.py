"""Masked loss: masks from alpha channels or a mask folder, rendered like their images, cached
with the latents, and a training run with every loss and noise option on at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import safe_open
from train_helpers import small_config

from trainer.config import TrainConfig
from trainer.data import DatasetError, prepare_dataset
from trainer.events import ListSink, Step
from trainer.objectives.losses import diffusion_loss
from trainer.run.loop import run

W, H = 96, 64  # a wide image: the 64 x 64 bucket crops it, so the crop must follow too


def _fake_vae(pixels: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(pixels, 8).repeat(1, 2, 1, 1)[:, :4]  # [B, 4, H/8, W/8]


def _left_quarter_off(mode: str) -> Image.Image:
    """White except its left quarter (x < 24): a mask, or an alpha channel."""
    mask = np.full((H, W), 255, dtype=np.uint8)
    mask[:, : W // 4] = 0
    return Image.fromarray(mask, mode)


def _dataset(root: Path, source: str) -> tuple[Path, dict]:
    folder = root / "train" / "1_thing"
    folder.mkdir(parents=True)
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8))
    if source == "alpha":
        rgba = rgb.convert("RGBA")
        rgba.putalpha(_left_quarter_off("L"))
        rgba.save(folder / "img.png")
        return root / "train", {"alpha_mask": True}
    rgb.save(folder / "img.png")
    (root / "masks").mkdir()
    _left_quarter_off("L").save(root / "masks" / "img.png")
    return root / "train", {"mask_data_dir": str(root / "masks")}


def _prepare(train: Path, **dataset):
    ds = dict(train_data_dir=str(train), resolution=64, min_bucket_reso=64,
              max_bucket_reso=64, bucket_reso_steps=64, enable_bucket=False,
              cache_latents=False)
    ds.update(dataset)
    cfg = TrainConfig(dataset=ds, training={"masked_loss": True})
    return prepare_dataset(cfg, lambda _: None, data_home=train.parent)


def _expected_mask(flip: bool) -> torch.Tensor:
    """The mask by hand: 96 x 64 resized to cover 64 x 64 is 96 x 64 (no resize), the center
    crop keeps x in 16..80, so the black x < 24 is the crop's first 8 pixels = 1 latent column."""
    mask = torch.ones(1, 8, 8)
    mask[..., 0] = 0.0
    return mask.flip(-1) if flip else mask


def test_zero_mask_removes_those_pixels_from_the_gradient():
    pred = torch.randn(2, 4, 8, 8, requires_grad=True)
    mask = torch.ones(2, 1, 8, 8)
    mask[..., :4] = 0.0
    diffusion_loss(pred, torch.zeros_like(pred), mask=mask).backward()
    assert torch.all(pred.grad[..., :4] == 0) and torch.all(pred.grad[..., 4:] != 0)


@pytest.mark.parametrize("source", ["alpha", "folder"])
def test_masks_load_from_alpha_or_folder_with_crop_and_flip(tmp_path, source):
    train, options = _dataset(tmp_path, source)
    data = _prepare(train, flip_aug=True, **options)
    geometry = data._geometry(0, None)
    for flip in (False, True):
        assert torch.allclose(data._mask(0, flip, geometry), _expected_mask(flip), atol=1e-6)
    batches = [b for epoch in range(1, 9) for b in data.epoch(epoch, 1, 3)]
    assert all(b.mask.shape == (1, 1, 8, 8) for b in batches)
    plain = data._pixels(0, False, geometry)
    flipped = [not torch.equal(b.pixels[0], plain) for b in batches]
    assert any(flipped) and not all(flipped)
    for batch, flip in zip(batches, flipped):  # the mask flips with its image
        assert torch.equal(batch.pixels[0], plain.flip(-1) if flip else plain)
        assert torch.allclose(batch.mask[0], _expected_mask(flip), atol=1e-6)


@pytest.mark.parametrize("to_disk", [False, True])
def test_latent_cache_carries_the_mask(tmp_path, to_disk):
    train, options = _dataset(tmp_path, "folder")
    data = _prepare(train, flip_aug=True, cache_latents=True, **options)
    assert data.cache_latents(_fake_vae, "fake", to_disk=to_disk) == 1
    for flip in (False, True):
        latent, mask = data._latents.get_with_mask(0, flip)
        assert torch.allclose(mask, _expected_mask(flip), atol=1e-6)
        assert torch.equal(latent, data.cached_latent(0, flip))
    batch = next(iter(data.epoch(1, 1, 3)))
    assert batch.latents is not None and batch.pixels is None and batch.mask.shape == (1, 1, 8, 8)
    if to_disk:
        files = list((train / ".cache").glob("*.safetensors"))
        with safe_open(str(files[0]), framework="pt") as f:
            assert "mask" in f.keys()


def test_a_disk_cache_without_masks_is_not_reused_for_a_masked_run(tmp_path):
    train, options = _dataset(tmp_path, "folder")
    plain = TrainConfig(dataset=dict(train_data_dir=str(train), resolution=64,
                                     enable_bucket=False))
    unmasked = prepare_dataset(plain, lambda _: None, data_home=tmp_path)
    assert unmasked.cache_latents(_fake_vae, "fake", to_disk=True) == 1
    masked = _prepare(train, cache_latents=True, **options)
    assert masked.cache_latents(_fake_vae, "fake", to_disk=True) == 1  # encoded again
    assert masked.cache_latents(_fake_vae, "fake", to_disk=True) == 0  # now reused
    (tmp_path / "masks" / "img.png").unlink()  # another mask: another key
    _left_quarter_off("L").transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(
        tmp_path / "masks" / "img.png")
    again = _prepare(train, cache_latents=True, **options)
    assert again.cache_latents(_fake_vae, "fake", to_disk=True) == 1


def test_a_missing_mask_names_the_image_and_the_folder(tmp_path):
    train, options = _dataset(tmp_path, "folder")
    (tmp_path / "masks" / "img.png").unlink()
    with pytest.raises(DatasetError) as err:
        _prepare(train, **options)
    assert "img.png" in str(err.value) and str(tmp_path / "masks") in str(err.value)


SPIED = ("offset_noise", "pyramid_noise", "sample_timesteps", "v_pred_like_noise_pred_weights",
         "debiased_weights", "min_snr_weights", "huber_threshold", "diffusion_loss")


def test_training_with_every_loss_and_noise_option(tmp_path, monkeypatch):
    from trainer.objectives import ddpm
    from trainer.run import step

    calls: dict[str, list] = {name: [] for name in SPIED}
    for name in SPIED:  # every option reaches the loss of every step
        module = step if name == "diffusion_loss" else ddpm  # where the step looks them up
        def spy(*args, _name=name, _real=getattr(module, name), **kwargs):
            calls[_name].append((args, kwargs))
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, spy)
    train, options = _dataset(tmp_path, "alpha")
    training = {"max_train_steps": 2, "masked_loss": True, "noise_offset": 0.05,
                "noise_offset_random_strength": True, "adaptive_noise_scale": 0.01,
                "multires_noise_iterations": 4, "multires_noise_discount": 0.3,
                "min_timestep": 100, "max_timestep": 900, "debiased_estimation_loss": True,
                "scale_v_pred_loss_like_noise_pred": True, "min_snr_gamma": 5.0,
                "loss_type": "huber", "huber_schedule": "snr"}
    cfg = small_config(tmp_path, train, training=training,
                       dataset={"cache_latents_to_disk": True, "flip_aug": True, **options},
                       model={"prediction_type": "v_prediction"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    losses = [event.loss for event in sink.of(Step)]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert Path(result.output_path).is_file()
    assert all(len(calls[name]) == 2 for name in SPIED), {k: len(v) for k, v in calls.items()}
    assert calls["sample_timesteps"][0][0][2:4] == (100, 900)
    assert calls["offset_noise"][0][1]["random_strength"] is True
    args = calls["diffusion_loss"][0][0]  # pred, target, weights, loss_type, huber_c, mask
    assert args[3] == "huber" and args[4].shape == (1,)
    assert torch.equal(args[5][0, 0, :, 0], torch.zeros(8)) or \
        torch.equal(args[5][0, 0, :, -1], torch.zeros(8))  # the masked column, maybe flipped
