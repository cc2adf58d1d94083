"""The latent cache: every image encoded once, kept in memory or in safetensors files.

A disk cache file is named by a key that covers everything its latents depend on: the image's
bytes (SHA-256), the bucket, the resize and crop geometry, whether a flipped latent is stored,
and the caller's ``vae_id``; with edit training's control images (trainer/data/controls.py),
each control's bytes and geometry too (their latents are stored in the target's file as
``control_0``, ``control_0_flipped``, ...; a key without controls is the same as before). A run
that finds a valid file for a key encodes nothing for that image; any change (new pixels,
another resolution, another VAE, another control) gives a new key, so the image is encoded
again. Files are written atomically (a temporary name, then a rename) and checked on reading
(a broken file is encoded again). Old files are not deleted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trainer.system.safe_write import save_safetensors_atomic

from .buckets import Box, Size, bucket_name
from .images import load_image, render, to_tensor
from .masks import MaskSource, render_mask

CACHE_FORMAT = "1"
Encode = Callable[[torch.Tensor], torch.Tensor]
# images per encode call, or a function of the bucket giving the rows per call (sized to memory
# by trainer/data/cache_batches.py); with flip_aug an image and its mirror share a call
BatchSize = Union[int, Callable[[Size], int]]


@dataclass(frozen=True)
class ControlJob:
    """One control image of a target, with its render geometry (trainer/data/control_sizing)."""

    path: Path
    content_hash: str
    size: Size  # the trained size (the target's bucket, or its own)
    resized: Size
    box: Box


@dataclass(frozen=True)
class LatentJob:
    """One image to cache: its index in the dataset and its render geometry."""

    index: int
    path: Path
    content_hash: str
    bucket: Size
    resized: Size
    box: Box
    mask: Optional[MaskSource] = None  # training.masked_loss: the mask is cached beside
    controls: tuple[ControlJob, ...] = ()  # edit training: cached beside, in reference order


def latent_cache_key(job: LatentJob, flip: bool, vae_id: str) -> str:
    parts = [
        CACHE_FORMAT, job.content_hash, bucket_name(job.bucket), bucket_name(job.resized),
        ",".join(map(str, job.box)), f"flip={int(flip)}", vae_id,
    ]
    if job.mask is not None:  # a file without the mask is never reused for a masked run
        parts.append(f"mask={job.mask.key}")
    for i, c in enumerate(job.controls):
        parts.append(f"control{i}={c.content_hash},{bucket_name(c.size)},"
                     f"{bucket_name(c.resized)},{','.join(map(str, c.box))}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()


def control_name(index: int, flipped: bool = False) -> str:
    return f"control_{index}" + ("_flipped" if flipped else "")


def _names(flip: bool, mask: bool = False, controls: int = 0) -> list[str]:
    return ((["latent", "latent_flipped"] if flip else ["latent"]) + (["mask"] if mask else [])
            + [control_name(i, f) for i in range(controls) for f in (False, True)[:1 + flip]])


def is_valid_cache_file(path: Path, key: str, flip: bool, mask: bool = False,
                        controls: int = 0) -> bool:
    """True when ``path`` is a readable cache file for ``key`` holding the needed latents."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return ((f.metadata() or {}).get("key") == key
                    and set(_names(flip, mask, controls)) <= set(f.keys()))
    except Exception:  # missing, truncated or not safetensors: encode again
        return False


class LatentStore:
    """Latents per image index: tensors in memory, or files read when a batch needs them.

    A lazy store (``build_latent_cache(..., lazy=True)``) also holds the images not encoded
    yet and encodes each one the first time a batch asks for it, alone (one call per image and
    its mirror), so that its latent never depends on which images shared its batch."""

    def __init__(self) -> None:
        self._memory: dict[int, dict[str, torch.Tensor]] = {}
        self._files: dict[int, Path] = {}
        self._pending: dict[int, LatentJob] = {}
        self._encode_pending: Optional[Callable[[LatentJob], None]] = None

    def put(self, index: int, latents: dict[str, torch.Tensor]) -> None:
        self._memory[index] = latents

    def put_file(self, index: int, path: Path) -> None:
        self._files[index] = path

    def __len__(self) -> int:
        return len(self._memory) + len(self._files) + len(self._pending)

    def defer(self, jobs: list[LatentJob], encode_one: Callable[[LatentJob], None]) -> None:
        """Encode ``jobs`` later, each with ``encode_one`` when a batch first asks for it."""
        self._pending.update((job.index, job) for job in jobs)
        self._encode_pending = encode_one

    @property
    def pending(self) -> int:
        """Images of a lazy store that no batch has asked for yet."""
        return len(self._pending)

    def _ready(self, index: int) -> None:
        job = self._pending.get(index)
        if job is not None and self._encode_pending is not None:
            self._encode_pending(job)
            del self._pending[index]  # after: an encode that failed is tried again

    def _entry(self, index: int) -> dict[str, torch.Tensor]:
        self._ready(index)
        latents = self._memory.get(index)
        return load_file(str(self._files[index])) if latents is None else latents

    def get(self, index: int, flipped: bool = False) -> torch.Tensor:
        return self._entry(index)["latent_flipped" if flipped else "latent"]

    def get_controls(self, index: int, flipped: bool = False) -> list[torch.Tensor]:
        """The cached latents of image ``index``'s controls, in reference order (flipped with
        it)."""
        entry, out = self._entry(index), []
        while control_name(len(out)) in entry:
            out.append(entry[control_name(len(out), flipped)])
        return out

    def get_with_mask(self, index: int, flipped: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent and its cached loss mask [1, h, w] (flipped with it), one file read."""
        entry = self._entry(index)
        latent = entry["latent_flipped" if flipped else "latent"]
        mask = entry["mask"] if "mask" in entry else torch.ones(1, *latent.shape[-2:])
        return latent, mask.flip(-1) if flipped else mask


def _pixels(job: LatentJob) -> torch.Tensor:
    return to_tensor(render(load_image(job.path).rgb, job.resized, job.box))


def _encode(encode: Encode, pixels: torch.Tensor, bucket: Size) -> torch.Tensor:
    """Latents of ``pixels`` (all of the size ``bucket``), checked for their shape."""
    with torch.no_grad():
        out = encode(pixels)
    expected = (pixels.shape[0], bucket[1] // 8, bucket[0] // 8)
    if out.ndim != 4 or (out.shape[0], out.shape[2], out.shape[3]) != expected:
        raise ValueError(
            f"the encoder returned a tensor of shape {tuple(out.shape)} for pixels of shape "
            f"{tuple(pixels.shape)}; expected [B, C, H/8, W/8]"
        )
    return out.detach().cpu()


def encode_jobs(
    jobs: list[LatentJob], encode: Encode, flip: bool, batch_size: BatchSize
) -> Iterator[tuple[LatentJob, dict[str, torch.Tensor]]]:
    """Encode jobs in batches of one bucket each; yields each job with its latents."""
    by_bucket: dict[Size, list[LatentJob]] = {}
    for job in jobs:
        by_bucket.setdefault(job.bucket, []).append(job)
    for bucket in sorted(by_bucket):
        group = by_bucket[bucket]
        size = _batch_size(batch_size, bucket)
        if flip and callable(batch_size):  # sized to memory in rows: an image is two rows
            size = max(1, size // 2)
        for start in range(0, len(group), size):
            chunk = group[start : start + size]
            pixels = torch.stack([_pixels(j) for j in chunk])
            if flip:  # flipping the rendered crop equals rendering with flip=True
                both = _encode(encode, torch.cat([pixels, pixels.flip(-1)]), bucket)
                outputs = {"latent": both[: len(chunk)], "latent_flipped": both[len(chunk) :]}
            else:
                outputs = {"latent": _encode(encode, pixels, bucket)}
            controls = _encode_controls(chunk, encode, flip)
            for row, job in enumerate(chunk):
                latents = {name: t[row].clone() for name, t in outputs.items()}
                if job.mask is not None:
                    latents["mask"] = render_mask(job.mask, job.resized, job.box)
                latents.update(controls[row])
                yield job, latents


def _encode_controls(chunk: list[LatentJob], encode: Encode, flip: bool
                     ) -> list[dict[str, torch.Tensor]]:
    """Per job of ``chunk``, its controls' latents: one encode call per control size (the
    target's bucket, unless a family sizes its controls itself), mirrors in the same call."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in chunk]
    by_size: dict[Size, list[tuple[int, int, ControlJob]]] = {}
    for row, job in enumerate(chunk):
        for index, control in enumerate(job.controls):
            by_size.setdefault(control.size, []).append((row, index, control))
    for size, group in by_size.items():
        pixels = torch.stack([to_tensor(render(load_image(c.path).rgb, c.resized, c.box))
                              for _, _, c in group])
        both = _encode(encode, torch.cat([pixels, pixels.flip(-1)]) if flip else pixels, size)
        for n, (row, index, _) in enumerate(group):
            out[row][control_name(index)] = both[n].clone()
            if flip:
                out[row][control_name(index, True)] = both[len(group) + n].clone()
    return out


def _batch_size(batch_size: BatchSize, bucket: Size) -> int:
    size = batch_size(bucket) if callable(batch_size) else batch_size
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {size}")
    return size


def build_latent_cache(
    jobs: list[LatentJob],
    encode: Encode,
    vae_id: str,
    flip: bool,
    cache_dir: Optional[Path],
    batch_size: BatchSize = 4,
    lazy: bool = False,
) -> tuple[LatentStore, int]:
    """Cache every job's latents (on disk when ``cache_dir`` is given); returns the store and
    the number of images that were encoded. ``lazy``: encode none now; the store encodes each
    image (and writes its file) when a batch first asks for it, and the number returned is
    how many it will encode."""
    if not callable(batch_size) and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    store, todo, files = LatentStore(), [], {}
    for job in jobs:
        if cache_dir is None:
            todo.append(job)
            continue
        key = latent_cache_key(job, flip, vae_id)
        files[job.index] = (cache_dir / f"{key}.safetensors", key)
        if is_valid_cache_file(files[job.index][0], key, flip, job.mask is not None,
                               len(job.controls)):
            store.put_file(job.index, files[job.index][0])
        else:
            todo.append(job)

    def keep(job: LatentJob, latents: dict[str, torch.Tensor]) -> None:
        if cache_dir is None:
            store.put(job.index, latents)
            return
        path, key = files[job.index]
        meta = {"key": key, "format": CACHE_FORMAT, "bucket": bucket_name(job.bucket),
                "vae_id": vae_id, "source": job.path.name}
        save_safetensors_atomic(path, {k: v.contiguous() for k, v in latents.items()}, meta)
        store.put_file(job.index, path)

    if lazy:
        store.defer(todo, lambda job: keep(*next(encode_jobs([job], encode, flip, 1))))
        return store, len(todo)
    for job, latents in encode_jobs(todo, encode, flip, batch_size):
        keep(job, latents)
    return store, len(todo)
