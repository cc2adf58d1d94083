"""The embedded sample dataset: deterministic, idempotent, and usable with the default config."""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from trainer.config import EMBEDDED_DATASET, TrainConfig
from trainer.data import ensure_sample_dataset, prepare_dataset, resolve_dataset_dir


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_same_bytes_every_time_and_everywhere(tmp_path):
    first = snapshot(ensure_sample_dataset(tmp_path / "a"))
    second = snapshot(ensure_sample_dataset(tmp_path / "b"))
    assert first == second
    images = [name for name in first if name.endswith(".png")]
    assert len(images) == 6 and all(name.startswith("10_shapes/") for name in first)
    sizes = set()
    for name in images:
        with Image.open(tmp_path / "a" / name) as img:
            sizes.add(img.size)
    assert sizes == {(256, 256), (256, 384), (384, 256)}
    caption = first["10_shapes/00_red_circle.txt"].decode()
    assert caption.strip() == "a red circle, blue background"


def test_existing_files_are_not_rewritten_but_damaged_ones_are(tmp_path):
    root = ensure_sample_dataset(tmp_path / "s")
    image = root / "10_shapes" / "00_red_circle.png"
    os.utime(image, ns=(1_000_000_000, 1_000_000_000))
    ensure_sample_dataset(root)
    assert image.stat().st_mtime_ns == 1_000_000_000
    good = image.read_bytes()
    image.write_bytes(b"broken")
    ensure_sample_dataset(root)
    assert image.read_bytes() == good


def test_resolve_dataset_dir(tmp_path):
    path = resolve_dataset_dir(EMBEDDED_DATASET, tmp_path)
    assert path == tmp_path / "embedded" / "sample-dataset"
    assert (path / "10_shapes" / "00_red_circle.png").is_file()
    assert resolve_dataset_dir("/some/where", tmp_path) == Path("/some/where")


def test_default_config_trains_on_the_sample_dataset(tmp_path):
    warnings: list[str] = []
    data = prepare_dataset(TrainConfig(), warnings.append, data_home=tmp_path)
    assert warnings == []
    assert data.num_images == 6 and data.num_repeated == 60
    assert len(data.bucket_table()) == 3
    assert data.steps_per_epoch(1) == 60
    small = TrainConfig(dataset={"resolution": 128, "min_bucket_reso": 64, "max_bucket_reso": 256,
                                 "bucket_reso_steps": 32})
    data = prepare_dataset(small, warnings.append, data_home=tmp_path)
    assert data.bucket_table() == {"96x160": 20, "128x128": 20, "160x96": 20}
