"""Latent cache (memory and disk: reuse, invalidation, flips) and the text-encoder cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from trainer.config import TrainConfig
from trainer.data import prepare_dataset, text_cache_allowed, text_cache_blocker

SIZES = {"sq": (128, 128), "tall": (96, 160), "wide": (170, 96)}


class FakeVAE:
    """Average-pool by 8, then a fixed 3 -> 4 channel 1x1 conv; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.images = 0
        self.weight = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10 - 0.5

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.images += pixels.shape[0]
        return torch.einsum("oc,bchw->bohw", self.weight, F.avg_pool2d(pixels, 8))


def write_images(root: Path) -> None:
    rng = np.random.default_rng(0)
    for name, (width, height) in SIZES.items():
        path = root / "2_thing" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path)
        path.with_suffix(".txt").write_text(f"a {name} thing")


def prepare(root: Path, **overrides):
    dataset = dict(train_data_dir=str(root), resolution=128, min_bucket_reso=64,
                   max_bucket_reso=256, bucket_reso_steps=32, cache_latents=True)
    network = overrides.pop("network", {})
    dataset.update(overrides)
    cfg = TrainConfig(dataset=dataset, network=network)
    return prepare_dataset(cfg, lambda _: None, data_home=root.parent)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_images(tmp_path / "train")
    return tmp_path / "train"


def all_latents(data) -> list[torch.Tensor]:
    return [data.cached_latent(i) for i in range(data.num_images)]


def test_disk_cache_is_reused_by_the_next_run(root):
    vae = FakeVAE()
    first = prepare(root)
    assert first.cache_latents(vae, "vae-a", to_disk=True) == 3
    assert vae.images == 3
    files = sorted((root / ".cache").glob("*.safetensors"))
    assert len(files) == 3
    assert not [p for p in (root / ".cache").iterdir() if p.suffix == ".tmp"]
    again, second = FakeVAE(), prepare(root)
    assert second.cache_latents(again, "vae-a", to_disk=True) == 0
    assert again.calls == 0
    for a, b in zip(all_latents(first), all_latents(second)):
        assert torch.equal(a, b)
    batch = next(second.epoch(0, 2, seed=0))
    assert batch.pixels is None and batch.latents is not None
    width, height = batch.bucket
    assert batch.latents.shape == (len(batch.captions), 4, height // 8, width // 8)


def test_disk_cache_is_rebuilt_when_something_changes(root):
    prepare(root).cache_latents(FakeVAE(), "vae-a", to_disk=True)
    assert prepare(root, resolution=96).cache_latents(FakeVAE(), "vae-a", to_disk=True) == 3
    assert prepare(root).cache_latents(FakeVAE(), "vae-b", to_disk=True) == 3
    assert prepare(root).cache_latents(FakeVAE(), "vae-a", to_disk=True) == 0
    Image.new("RGB", (128, 128), (1, 2, 3)).save(root / "2_thing" / "sq.png")  # new pixels
    assert prepare(root).cache_latents(FakeVAE(), "vae-a", to_disk=True) == 1
    victim = sorted((root / ".cache").glob("*.safetensors"))[0]
    victim.write_bytes(victim.read_bytes()[:20])  # a broken file is encoded again
    assert prepare(root).cache_latents(FakeVAE(), "vae-a", to_disk=True) == 1


def test_cache_dir_and_batch_size(root, tmp_path):
    vae = FakeVAE()
    data = prepare(root, resolution=64, enable_bucket=False)  # one bucket: 3 images, batches of 2
    assert data.cache_latents(vae, "v", to_disk=True, cache_dir=tmp_path / "elsewhere",
                              batch_size=2) == 3
    assert vae.calls == 2
    assert len(list((tmp_path / "elsewhere").glob("*.safetensors"))) == 3
    assert not (root / ".cache").exists()


def test_memory_cache_writes_nothing_and_matches_the_encoder(root):
    vae, data = FakeVAE(), prepare(root)
    assert data.cache_latents(vae, "v", to_disk=False) == 3
    assert not (root / ".cache").exists()
    reference = prepare(root, cache_latents=False)
    for cached, plain in zip(data.epoch(0, 1, seed=3), reference.epoch(0, 1, seed=3)):
        assert cached.paths == plain.paths
        assert torch.allclose(cached.latents, FakeVAE()(plain.pixels), atol=1e-5)


def test_flip_aug_caches_both_latents_and_picks_one_per_step(root):
    data = prepare(root, flip_aug=True)
    vae = FakeVAE()
    assert data.cache_latents(vae, "v", to_disk=True) == 3
    assert vae.images == 6  # each image encoded plain and flipped
    for path in (root / ".cache").glob("*.safetensors"):
        stored = load_file(path)
        assert torch.allclose(stored["latent_flipped"], stored["latent"].flip(-1), atol=1e-5)
    reused = prepare(root, flip_aug=True)
    assert reused.cache_latents(FakeVAE(), "v", to_disk=True) == 0
    index = [e.path.name for e in reused.entries].index("sq.png")
    plain = reused.cached_latent(index)
    seen = set()
    for epoch in range(6):
        for batch in reused.epoch(epoch, 1, seed=0):
            if batch.paths[0].name == "sq.png":
                seen.add("plain" if torch.equal(batch.latents[0], plain) else "flipped")
    assert seen == {"plain", "flipped"}
    assert prepare(root).cache_latents(FakeVAE(), "v", to_disk=True) == 3  # flip off: new key


def test_a_lazy_cache_encodes_each_image_alone_when_a_batch_first_needs_it(root):
    """The CPU's caches (trainer/run/caches.py): nothing is encoded before the first batch;
    each image is encoded once, alone with its mirror, the first time a batch asks for it; the
    latents equal the eager cache's; on disk, a file is written per image as it is encoded and
    the next run reads them."""
    vae, data = FakeVAE(), prepare(root, flip_aug=True)
    assert data.cache_latents(vae, "v", to_disk=True, lazy=True) == 3
    assert vae.calls == 0 and not list((root / ".cache").glob("*.safetensors"))
    first = next(data.epoch(0, 1, seed=0))
    assert vae.calls == 1 and vae.images == 2  # one image and its mirror, in one call
    assert len(list((root / ".cache").glob("*.safetensors"))) == 1
    for epoch in range(3):
        for _ in data.epoch(epoch, 2, seed=0):
            pass
    assert vae.calls == 3 and vae.images == 6  # every image once, however often it is used
    eager = prepare(root, flip_aug=True)
    eager.cache_latents(FakeVAE(), "v", to_disk=False)
    for a, b in zip(all_latents(data), all_latents(eager)):
        assert torch.allclose(a, b, atol=1e-6)
    index = [e.path for e in data.entries].index(first.paths[0])
    assert first.latents[0].shape == data.cached_latent(index).shape
    again = FakeVAE()
    assert prepare(root, flip_aug=True).cache_latents(again, "v", to_disk=True, lazy=True) == 0
    assert again.calls == 0


def test_a_lazy_encode_that_failed_is_tried_again(root):
    vae, data = FakeVAE(), prepare(root, resolution=64, enable_bucket=False)
    failing = {"left": 1}

    def flaky(pixels):
        if failing["left"]:
            failing["left"] -= 1
            raise RuntimeError("out of memory")
        return vae(pixels)

    data.cache_latents(flaky, "v", to_disk=False, lazy=True)
    with pytest.raises(RuntimeError, match="out of memory"):
        next(data.epoch(0, 1, seed=0))
    batch = next(data.epoch(0, 1, seed=0))  # the same image: encoded now, not lost
    assert vae.images == 1 and batch.latents.shape[0] == 1


def test_a_lazy_text_cache_encodes_each_caption_alone_once(root):
    (root / "2_thing" / "tall.txt").write_text("a sq thing")  # a duplicate caption
    data = prepare(root)
    calls: list[list[str]] = []
    assert data.cache_text(fake_text(calls), lazy=True) == 2
    assert calls == []
    for epoch in range(3):
        for batch in data.epoch(epoch, 3, seed=0):
            for caption, row in zip(batch.captions, batch.text.hidden):
                assert torch.equal(row, torch.full((2, 3), float(len(caption))))
    assert sorted(calls) == [["a sq thing"], ["a wide thing"]]


def test_random_crop_cannot_cache_latents(root):
    data = prepare(root, random_crop=True, cache_latents=False)
    with pytest.raises(ValueError, match="dataset.random_crop.*dataset.cache_latents"):
        data.cache_latents(FakeVAE(), "v", to_disk=False)


def fake_text(calls: list[list[str]]):
    def encode(captions: list[str]) -> torch.Tensor:
        calls.append(list(captions))
        return torch.stack([torch.full((2, 3), float(len(c))) for c in captions])

    return encode


def test_text_cache_encodes_each_caption_once(root):
    (root / "2_thing" / "tall.txt").write_text("a sq thing")  # a duplicate caption
    data = prepare(root, caption_prefix="photo")
    calls: list[list[str]] = []
    assert data.cache_text(fake_text(calls)) == 2
    assert sorted(c for call in calls for c in call) == ["photo, a sq thing",
                                                         "photo, a wide thing"]
    for batch in data.epoch(0, 2, seed=0):
        assert batch.text.hidden.shape == (len(batch.captions), 2, 3)
        assert batch.text.pooled is None
        for caption, row in zip(batch.captions, batch.text.hidden):
            assert torch.equal(row, torch.full((2, 3), float(len(caption))))


def test_text_cache_blocker_explains_why(root):
    assert text_cache_blocker(TrainConfig()) is None
    shuffled = TrainConfig(dataset={"shuffle_caption": True, "caption_dropout_rate": 0.1})
    assert "dataset.shuffle_caption" in text_cache_blocker(shuffled)
    assert "dataset.caption_dropout_rate" in text_cache_blocker(shuffled)
    trained = TrainConfig(network={"train_text_encoder": True})
    assert "network.train_text_encoder" in text_cache_blocker(trained)
    ti = TrainConfig(mode="textual_inversion", network={"token_string": "<x>"})
    assert "textual_inversion" in text_cache_blocker(ti)
    assert text_cache_allowed(TrainConfig()) == (True, "")
    allowed, why = text_cache_allowed(TrainConfig(), trains_text_encoder=True)
    assert not allowed and "text encoder is trained" in why
    data = prepare(root, caption_tag_dropout_rate=0.2)
    with pytest.raises(ValueError, match="caption_tag_dropout_rate"):
        data.cache_text(fake_text([]))


def test_latent_cache_with_a_real_autoencoder(root):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8, 8, 8),
        norm_num_groups=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    ).eval()

    def encode(pixels: torch.Tensor) -> torch.Tensor:
        return vae.encode(pixels).latent_dist.mode() * vae.config.scaling_factor

    data = prepare(root)
    assert data.cache_latents(encode, "tiny-vae", to_disk=True, batch_size=2) == 3
    assert prepare(root).cache_latents(encode, "tiny-vae", to_disk=True) == 0
    for batch in data.epoch(0, 2, seed=0):
        width, height = batch.bucket
        assert batch.latents.shape[1:] == (4, height // 8, width // 8)
        assert torch.isfinite(batch.latents).all()


def _masked_encoder(calls: list[list[str]]):
    """An encoder whose captions have lengths of their own (the Qwen-encoded families):
    padded to 8 tokens, row i's real tokens = the caption's word count, each = its length."""
    from trainer.models.text_conditioning import TextConditioning

    def encode(captions: list[str]) -> TextConditioning:
        calls.append(list(captions))
        hidden = torch.zeros(len(captions), 8, 3)
        mask = torch.zeros(len(captions), 8, dtype=torch.int64)
        for i, c in enumerate(captions):
            n = len(c.split())
            hidden[i, :n] = float(len(c))
            hidden[i, n:] = 99.0  # what the encoder puts after: never read back
            mask[i, :n] = 1
        return TextConditioning(hidden, None, mask)

    return encode


def test_text_cache_keeps_a_masked_captions_real_tokens_and_pads_each_batch(tmp_path):
    from trainer.data.text_cache import TextCache

    captions = ["a b", "a b c d", "a"]
    for folder in (None, tmp_path / "te"):
        for build in range(2):  # with a folder, the second build reads the files back
            calls: list[list[str]] = []
            cache = TextCache.build(captions, _masked_encoder(calls), folder=folder)
            assert calls == ([] if folder is not None and build else [sorted(captions)])
            text = cache.get(["a b", "a"])
            assert text.hidden.shape == (2, 2, 3)  # the batch's longest, not the encoder's 8
            assert text.mask.tolist() == [[1, 1], [1, 0]]
            assert text.lengths() == [2, 1]
            assert torch.equal(text.hidden[0], torch.full((2, 3), 3.0))
            assert torch.equal(text.hidden[1], torch.tensor([[1.0] * 3, [0.0] * 3]))
            assert [r.shape[0] for r in cache.get(["a b c d"]).rows()] == [4]
