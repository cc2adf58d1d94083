"""Issue 21: sd-scripts' --color_aug and --full_fp16. The colour change is checked against
sd-scripts' AugHelper.color_aug written out here (its draws, in its order, from the same
generator; the hue turned with colorsys, the gamma as clip(x ** gamma, 0, 255) on 0-255); the
fp16 weights against torch's GradScaler, whose unscale refuses fp16 gradients unless patched
as sd-scripts' patch_accelerator_for_fp16_training does."""

from __future__ import annotations

import colorsys
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.config.files import ConfigError, from_dict
from trainer.data import color_aug
from trainer.data.dataset import prepare_dataset
from trainer.importers.kohya import import_kohya
from trainer.run import full_fp16
from trainer.run.loop import run
from trainer.system.device import PrecisionError


def _sd_scripts_draw(rng: random.Random):
    if rng.random() <= 0.33:
        if rng.random() > 0.5:
            return "hue", rng.uniform(-8, 8)
        return "gamma", rng.uniform(0.95, 1.05)
    return None


def test_the_draws_are_sd_scripts_in_its_order():
    ours, theirs = random.Random(7), random.Random(7)
    draws = [color_aug.draw(ours) for _ in range(3000)]
    assert draws == [_sd_scripts_draw(theirs) for _ in range(3000)]
    changed = [d for d in draws if d]
    assert 0.30 < len(changed) / 3000 < 0.36
    assert 0.4 < sum(d[0] == "hue" for d in changed) / len(changed) < 0.6


def test_hue_and_gamma_change_the_pixels_as_sd_scripts():
    rgb = np.random.default_rng(0).integers(0, 256, (6, 5, 3)).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    hued = np.asarray(color_aug.apply(img, ("hue", -5.0)))  # OpenCV units: -10 degrees
    for pixel, got in zip(rgb.reshape(-1, 3), hued.reshape(-1, 3)):
        h, s, v = colorsys.rgb_to_hsv(*(pixel / 255.0))
        want = np.array(colorsys.hsv_to_rgb((h - 10 / 360) % 1.0, s, v)) * 255
        assert np.abs(np.rint(want) - got).max() <= 1
    gamma = np.asarray(color_aug.apply(img, ("gamma", 1.03)))
    want = [min(255, int(float(x) ** 1.03)) for x in rgb.reshape(-1)]
    assert gamma.reshape(-1).tolist() == want
    assert color_aug.apply(img, None) is img


def test_color_aug_refuses_the_latent_cache_and_imports_with_it_off():
    with pytest.raises(ConfigError, match="dataset.color_aug .* dataset.cache_latents off"):
        from_dict({"dataset": {"color_aug": True}})  # the cache is on by default
    assert from_dict({"dataset": {"color_aug": True, "cache_latents": False}}).dataset.color_aug
    cfg, report = import_kohya({"LoRA_type": "Standard", "color_aug": True,
                                "cache_latents": True, "cache_latents_to_disk": True})
    assert cfg.dataset.color_aug and not cfg.dataset.cache_latents
    assert not report.unsupported and any("color_aug changes the pixels" in n
                                          for n in report.notes)
    cfg, report = import_kohya({"LoRA_type": "Standard", "cache_latents": True,
                                "additional_parameters": "--color_aug --full_fp16",
                                "mixed_precision": "fp16"})
    assert cfg.dataset.color_aug and cfg.training.full_fp16 and not report.unsupported


def test_batches_carry_the_drawn_change(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    plain = small_config(tmp_path, data, dataset={"cache_latents": False})
    aug = small_config(tmp_path, data, dataset={"cache_latents": False, "color_aug": True})
    a, b = prepare_dataset(plain, warn=print), prepare_dataset(aug, warn=print)
    differ = 0
    for epoch in range(12):
        for x, y in zip(a.epoch(epoch, 1, seed=3), b.epoch(epoch, 1, seed=3)):
            differ += not torch.equal(x.pixels, y.pixels)
    assert 0 < differ < 12  # a third of the samples, drawn per step


def _metadata(path: str) -> dict[str, str]:
    with safe_open(path, "pt") as f:
        return f.metadata()


def test_two_steps_with_color_aug(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    result = run(small_config(tmp_path, data, training={"max_train_steps": 2},
                              dataset={"cache_latents": False, "color_aug": True}))
    assert result.status == "finished", result.error
    assert _metadata(result.output_path)["ss_color_aug"] == "True"


def test_full_fp16_needs_fp16_and_a_gpu(tmp_path):
    with pytest.raises(ConfigError, match="training.full_fp16 needs training.mixed_precision"):
        from_dict({"training": {"full_fp16": True}})
    with pytest.raises(ConfigError, match="full_fp16 and training.full_bf16"):
        from_dict({"training": {"full_fp16": True, "full_bf16": True,
                                "mixed_precision": "fp16"}})
    cfg = from_dict({"training": {"full_fp16": True, "mixed_precision": "fp16"}})
    full_fp16.check(True, "fp16", "cuda")  # validates for a CUDA (or ROCm) device
    full_fp16.check(True, "fp16", "rocm")
    assert full_fp16.trained_dtype(cfg.training) == torch.float16
    with pytest.raises(PrecisionError, match="needs a CUDA or ROCm GPU, but this run is on 'cpu'"):
        full_fp16.check(True, "fp16", "cpu")
    data = one_image_dataset(tmp_path / "data")
    result = run(small_config(tmp_path, data, training={"max_train_steps": 2, "full_fp16": True,
                                                        "mixed_precision": "fp16"}))
    assert result.status != "finished"
    assert "training.full_fp16 needs a CUDA or ROCm GPU" in str(result.error)


def test_the_patched_scaler_unscales_fp16_gradients():
    """accelerate keeps torch's GradScaler as accelerator.scaler under fp16; a CPU one has the
    same _unscale_grads_ (the CUDA path's code)."""
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    scaler.scale((weight.float() * 3).sum()).backward()
    assert weight.grad.dtype == torch.float16 and weight.grad[0].item() == 192.0
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(optimizer)
    accelerator = SimpleNamespace(scaler=torch.amp.GradScaler("cpu", init_scale=64.0))
    assert full_fp16.patch_scaler(accelerator)
    weight.grad = None
    accelerator.scaler.scale((weight.float() * 3).sum()).backward()
    accelerator.scaler.step(optimizer)  # unscales (3 each), steps, as accelerate's does
    accelerator.scaler.update()
    assert torch.allclose(weight.detach().float(), torch.full((4,), 1 - 0.5 * 3))
    assert not full_fp16.patch_scaler(SimpleNamespace(scaler=None))
