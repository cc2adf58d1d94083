"""The caches encode in batches sized to memory (issue 20): one bucket per call, as many images
as the budget allows, an image and its mirror in the same call; bf16 on a bf16 CPU run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from trainer.config import TrainConfig
from trainer.config.paths import PROJECT_ROOT
from trainer.data import cache_batches as cb
from trainer.data import prepare_dataset

SD_VAE = json.loads((PROJECT_ROOT / "trainer/assets/families/sd1/vae/config.json").read_text())
TINY_VAE = {"block_out_channels": [8, 8], "mid_block_add_attention": True}


class CountingVAE:
    """Average-pool by 8 to 4 channels; counts calls and rows."""

    def __init__(self) -> None:
        self.calls, self.rows, self.autocast = 0, 0, []

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.rows += pixels.shape[0]
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        pooled = torch.nn.functional.avg_pool2d(pixels, 8)
        return torch.cat([pooled, pooled[:, :1]], dim=1)


@pytest.fixture
def sixteen(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "train"
    for i in range(16):
        path = root / "1_thing" / f"{i:02d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
        path.with_suffix(".txt").write_text(f"photo {i}")
    return root


def prepare(root, **dataset):
    cfg = TrainConfig(dataset=dict(train_data_dir=str(root), resolution=64, enable_bucket=False,
                                   cache_latents=True, **dataset))
    return prepare_dataset(cfg, lambda _: None, data_home=root.parent)


def test_sixteen_images_in_one_call_when_memory_allows(sixteen):
    vae, data = CountingVAE(), prepare(sixteen)
    batches = cb.latent_batches(TINY_VAE, budget_bytes=1 << 30)
    assert data.cache_latents(vae, "v", to_disk=False, batch_size=batches) == 16
    assert (vae.calls, vae.rows) == (1, 16)


def test_a_small_budget_splits_the_bucket(sixteen):
    one = cb.latent_bytes(TINY_VAE, (64, 64), 4)
    vae, data = CountingVAE(), prepare(sixteen)
    assert data.cache_latents(vae, "v", to_disk=False,
                              batch_size=cb.latent_batches(TINY_VAE, 5 * one)) == 16
    assert (vae.calls, vae.rows) == (4, 16)  # 5, 5, 5, 1
    vae, data = CountingVAE(), prepare(sixteen)
    data.cache_latents(vae, "v", to_disk=False, batch_size=cb.latent_batches(TINY_VAE, 1))
    assert vae.calls == 16  # never less than one image per call


def test_an_image_and_its_mirror_share_a_call(sixteen):
    vae, data = CountingVAE(), prepare(sixteen, flip_aug=True)
    data.cache_latents(vae, "v", to_disk=False, batch_size=cb.latent_batches(TINY_VAE, 1 << 30))
    assert (vae.calls, vae.rows) == (1, 32)
    plain, mirrored = data.cached_latent(3), data.cached_latent(3, flipped=True)
    assert torch.allclose(mirrored, plain.flip(-1), atol=1e-6)
    vae, data = CountingVAE(), prepare(sixteen, flip_aug=True)  # rows: 8 per call -> 4 images
    one = cb.latent_bytes(TINY_VAE, (64, 64), 4)
    data.cache_latents(vae, "v", to_disk=False, batch_size=cb.latent_batches(TINY_VAE, 8 * one))
    assert (vae.calls, vae.rows) == (4, 32)


def test_the_text_cache_encodes_in_memory_sized_batches(sixteen):
    calls: list[int] = []

    def encode(captions):
        calls.append(len(captions))
        return torch.zeros(len(captions), 77, 8)

    config = {"hidden_size": 768, "num_hidden_layers": 12, "intermediate_size": 3072,
              "num_attention_heads": 12}
    data = prepare(sixteen)
    assert data.cache_text(encode, batch_size=cb.text_batch([(config, 77)], 1 << 30, 4)) == 16
    assert calls == [16]
    one = cb.text_bytes([(config, 77)], 4)
    data = prepare(sixteen)
    data.cache_text(encode, batch_size=cb.text_batch([(config, 77)], 6 * one, 4))
    assert calls[1:] == [6, 6, 4]


def test_the_estimates_are_of_the_measured_size():
    # SD's VAE measured 2.7 KB per pixel in fp32 (bench: ru_maxrss of one encode)
    per_pixel = cb.latent_bytes(SD_VAE, (512, 512), 4) / (512 * 512)
    assert 2700 <= per_pixel <= 4 * 2700
    assert cb.latent_bytes(SD_VAE, (512, 512), 2) * 2 == cb.latent_bytes(SD_VAE, (512, 512), 4)
    assert cb.latent_batches(SD_VAE, 8 << 30)((512, 512)) == 9
    assert cb.latent_batches(SD_VAE, 64 << 30)((64, 64)) == cb.MAX_LATENT_BATCH


def test_the_budget_is_half_the_free_memory(monkeypatch):
    monkeypatch.setattr(cb, "memory_free", lambda info: 10 << 30)
    assert cb.budget(None) == 5 << 30
    monkeypatch.setattr(cb, "memory_free", lambda info: None)
    assert cb.budget(None) == cb.FALLBACK_BUDGET


def test_bf16_cpu_runs_encode_under_autocast_and_cache_fp32(sixteen):
    vae, data = CountingVAE(), prepare(sixteen)
    encode = cb.latent_encoder(vae, "cpu", torch.bfloat16)
    data.cache_latents(encode, "v", to_disk=False, batch_size=4)
    assert vae.autocast == [True] * 4 and data.cached_latent(0).dtype == torch.float32
    fp32 = CountingVAE()
    cb.latent_encoder(fp32, "cpu", torch.float32)(torch.zeros(1, 3, 64, 64))
    assert fp32.autocast == [False]
    assert cb.latent_id("abc", "cpu", torch.bfloat16) != cb.latent_id("abc", "cpu", torch.float32)
    assert cb.latent_id("abc", "cuda", torch.bfloat16) == "abc"


def test_the_latents_are_cached_before_the_denoiser_takes_the_device(tmp_path, monkeypatch):
    """As sd-scripts does: on a GPU the VAE encodes with the memory the UNet takes later (an
    SDXL-size UNet in bf16 is 4.8 GiB beside a 1024 px image's 2.5 GiB encode); the text cache
    comes after the model is placed (its encoders are). Eager caching (a GPU's) on the CPU."""
    from train_helpers import one_image_dataset, small_config

    from trainer.run import caches, session
    from trainer.run.loop import run

    order: list[tuple[str, str]] = []

    def spy(name, real):
        def call(s, *args):
            lora = any("lora" in n for n, _ in s.model.unet.named_parameters())
            order.append((name, "UNet injected" if lora else "UNet as loaded"))
            return real(s, *args)
        return call

    monkeypatch.setattr(caches, "lazy", lambda s: False)
    for name in ("fill_latent_cache", "fill_text_cache", "_place_and_inject"):
        monkeypatch.setattr(session, name, spy(name, getattr(session, name)))
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       dataset={"cache_latents": True}, training={"max_train_steps": 1})
    result = run(cfg)
    assert result.status == "finished", result.error
    assert order == [("fill_latent_cache", "UNet as loaded"),
                     ("_place_and_inject", "UNet as loaded"),
                     ("fill_text_cache", "UNet injected")]
