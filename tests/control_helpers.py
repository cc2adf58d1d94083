"""Tiny edit-training datasets for the control-image tests (tests/test_data_controls*.py).

The data tests run on SD 1.x's fast embedded model, so ``as_edit_family`` lends SD 1.x (the
embedded default's family) a ``ControlSpec`` for one test (FLUX.1 Kontext, the registry's edit
family, trains in tests/test_flux_kontext_train.py); the config's ``dataset.control_dir``
is then set on the section (the TrainConfig rule refuses it at load for a family that takes
none, which is what the refusal tests check).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from trainer.config import TrainConfig
from trainer.data import prepare_dataset
from trainer.families import FAMILIES
from trainer.families.spec import ControlSpec

FAMILY = "sd1"  # the embedded default's family


def as_edit_family(monkeypatch, **controls) -> None:
    monkeypatch.setitem(FAMILIES, FAMILY, replace(FAMILIES[FAMILY],
                                                  controls=ControlSpec(**controls)))


def noise(path: Path, size: tuple[int, int], seed: int) -> np.ndarray:
    """A random RGB image of ``size`` (w, h) written to ``path``; returns its pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return rgb


def inverted(target: Path, control: Path) -> None:
    """``control``: ``target``'s pixels inverted (255 - x), so that a control rendered with its
    target's resize, crop and flip is exactly minus the target's pixels in [-1, 1]."""
    control.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.asarray(Image.open(target).convert("RGB"))
    Image.fromarray((255 - rgb).astype(np.uint8)).save(control)


def pairs(root: Path, names=("a", "b", "c"), sizes=((160, 128), (128, 160), (128, 128)),
          controls: str = "control") -> Path:
    """root/train/3_edit/<name>.png + caption, each with an inverted control in
    root/train/<controls>/; returns the train folder."""
    train = root / "train"
    for seed, (name, size) in enumerate(zip(names, sizes)):
        image = train / "3_edit" / f"{name}.png"
        noise(image, size, seed)
        image.with_suffix(".txt").write_text(f"make {name} inverted")
        inverted(image, train / controls / f"{name}.png")
    return train


def config(train: Path, control_dir: str | None = "control", **dataset) -> TrainConfig:
    cfg = TrainConfig(dataset={"train_data_dir": str(train), "resolution": 128,
                               "min_bucket_reso": 64, "max_bucket_reso": 256,
                               "bucket_reso_steps": 32, "cache_latents": False, **dataset})
    cfg.dataset.control_dir = control_dir  # validated by the section, not the family rule
    return cfg


def prepare(train: Path, control_dir: str | None = "control", warn=None, **dataset):
    return prepare_dataset(config(train, control_dir, **dataset),
                           warn or (lambda _: None), data_home=train.parent)


class FakeVAE:
    """Average-pool by 8, then a fixed 3 -> 4 channel 1x1 conv (linear: minus the pixels gives
    minus the latents); counts the images it encodes."""

    def __init__(self) -> None:
        self.images = 0
        self.weight = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10 - 0.5

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.images += pixels.shape[0]
        return torch.einsum("oc,bchw->bohw", self.weight, F.avg_pool2d(pixels, 8))


def watch_edit_run(monkeypatch, family_class, at_save) -> tuple[dict, list]:
    """Watch an edit LoRA run: ``family_class.predict`` records the shapes of each training
    step's controls (a tuple per step) and, at the final save, ``at_save(model)`` gives what the
    trained model computes (``trained["out"]``), to compare with what a pipeline computes once
    the saved file is loaded."""
    from trainer.methods.lora import LoraMethod

    trained, steps = {}, []
    real_save, real_predict = LoraMethod.save, family_class.predict

    def save(self, path, model, facts, final=True):
        if final:
            trained["saving"] = True
            trained["out"] = at_save(model)
        return real_save(self, path, model, facts, final)

    def seen(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        if "saving" not in trained:  # the run's steps
            steps.append(tuple(tuple(c.shape) for c in controls or ()))
        return real_predict(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    monkeypatch.setattr(LoraMethod, "save", save)
    monkeypatch.setattr(family_class, "predict", seen)
    return trained, steps
