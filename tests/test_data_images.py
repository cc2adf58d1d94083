"""Image decoding: EXIF orientation, alpha, and every mode converted to 8-bit RGB."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from trainer.data.images import inspect_image, load_image, render, to_tensor


def test_exif_orientation_is_applied(tmp_path):
    img = Image.new("RGB", (40, 20), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 20, 20))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    path = tmp_path / "rotated.png"
    img.save(path, exif=exif)
    loaded = load_image(path)
    assert loaded.rgb.size == (20, 40)
    assert loaded.rgb.getpixel((10, 5)) == (255, 0, 0)  # the left half is now on top
    assert loaded.rgb.getpixel((10, 35)) == (0, 0, 255)
    assert inspect_image(path).size == (20, 40)


def test_rgba_is_composited_on_white_and_alpha_kept(tmp_path):
    img = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    img.putpixel((1, 1), (255, 0, 0, 255))
    img.putpixel((2, 2), (0, 0, 0, 128))
    path = tmp_path / "rgba.png"
    img.save(path)
    loaded = load_image(path)
    assert loaded.rgb.mode == "RGB"
    assert loaded.rgb.getpixel((0, 0)) == (255, 255, 255)
    assert loaded.rgb.getpixel((1, 1)) == (255, 0, 0)
    assert loaded.rgb.getpixel((2, 2))[0] in (126, 127, 128)  # half black over white
    assert loaded.alpha is not None
    assert loaded.alpha.getpixel((0, 0)) == 0 and loaded.alpha.getpixel((1, 1)) == 255


def test_grayscale_becomes_rgb(tmp_path):
    path = tmp_path / "gray.png"
    Image.new("L", (4, 4), 100).save(path)
    loaded = load_image(path)
    assert loaded.rgb.mode == "RGB" and loaded.alpha is None
    assert loaded.rgb.getpixel((0, 0)) == (100, 100, 100)


def test_cmyk_becomes_rgb(tmp_path):
    img = Image.new("CMYK", (16, 16), (0, 0, 0, 0))
    img.paste((0, 255, 255, 0), (0, 0, 8, 16))  # left half red in CMYK
    path = tmp_path / "cmyk.jpg"
    img.save(path, quality=95)
    with Image.open(path) as reopened:
        assert reopened.mode == "CMYK"
    rgb = load_image(path).rgb
    assert rgb.mode == "RGB"
    assert all(abs(a - b) < 20 for a, b in zip(rgb.getpixel((12, 8)), (255, 255, 255)))
    red = rgb.getpixel((2, 8))
    assert red[0] > 200 and red[1] < 60 and red[2] < 60


def test_16_bit_grayscale_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 32896, 65535, 1000]], dtype=np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(values).save(path)
    with Image.open(path) as reopened:
        assert reopened.mode.startswith("I")
    rgb = load_image(path).rgb
    assert rgb.mode == "RGB"
    assert [rgb.getpixel((x, 0))[0] for x in range(4)] == [0, 128, 255, 4]


def test_palette_with_and_without_transparency(tmp_path):
    img = Image.new("P", (4, 1))
    img.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    img.putdata([0, 1, 0, 1])
    plain = tmp_path / "plain.png"
    img.save(plain)
    assert load_image(plain).rgb.getpixel((1, 0)) == (0, 255, 0)
    assert load_image(plain).alpha is None
    transparent = tmp_path / "transparent.png"
    img.save(transparent, transparency=0)
    loaded = load_image(transparent)
    assert loaded.rgb.getpixel((0, 0)) == (255, 255, 255)
    assert loaded.rgb.getpixel((1, 0)) == (0, 255, 0)
    assert loaded.alpha is not None and loaded.alpha.getpixel((0, 0)) == 0


def test_inspect_rejects_empty_corrupt_and_truncated_files(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"this is not an image at all" * 10)
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    whole = tmp_path / "whole.png"
    Image.fromarray(noise).save(whole)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match="0 bytes"):
        inspect_image(empty)
    with pytest.raises(ValueError, match="not a readable image"):
        inspect_image(corrupt)
    with pytest.raises(ValueError, match="truncated"):
        inspect_image(truncated)
    assert inspect_image(whole).size == (64, 64)


def test_render_resizes_crops_flips_and_scales_to_minus_one_one():
    img = Image.new("RGB", (20, 10), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 10, 10))  # left half white
    out = render(img, (40, 20), (10, 0, 30, 20))
    assert out.size == (20, 20)
    flipped = render(img, (40, 20), (10, 0, 30, 20), flip=True)
    tensor, tensor_flipped = to_tensor(out), to_tensor(flipped)
    assert tensor.shape == (3, 20, 20)
    assert tensor.min() >= -1 and tensor.max() <= 1
    assert tensor[0, 10, 0] == 1.0 and tensor[0, 10, 19] == -1.0
    assert torch.equal(tensor_flipped, tensor.flip(-1))
