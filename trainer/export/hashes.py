"""The hashes the ecosystem keeps in, and computes over, safetensors files.

``sshs_model_hash`` / ``sshs_legacy_hash`` are the hashes that sd-webui-additional-networks (and
AUTOMATIC1111 after it) compute to index a LoRA; sd-scripts precalculates them at save time so
the UI need not read the file. Both are defined over the file that sd-scripts' hash helper
serializes: the tensors with only the ``ss_*`` metadata (training facts, which never change after
training; user-editable keys such as ``modelspec.title`` are left out so that editing them does
not change the hash).

- model hash: SHA-256 (hex) of everything after the header, i.e. of the tensor data alone. The
  metadata changes the header only, so it equals the hash of the final file's data section.
- legacy hash: the first 8 hex digits of the SHA-256 of the 64 KiB at offset 1 MiB of that
  serialization (so of an empty string for files under 1 MiB: ``e3b0c442``).

``modelspec.hash_sha256`` (sai_model_spec 1.0.1) is ``0x`` + the same data-section SHA-256, as
the spec's reference implementation computes it.

For the base model, ``ss_sd_model_hash`` is AUTOMATIC1111's old 8-digit file hash (64 KiB at
1 MiB) and ``ss_new_sd_model_hash`` the SHA-256 of the whole file: see :func:`file_hashes`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

LEGACY_OFFSET = 0x100000
LEGACY_LENGTH = 0x10000
_BLOCK = 1024 * 1024


def safetensors_data_offset(data: bytes) -> int:
    """Where the tensor data of a serialized safetensors file starts (8 + header length)."""
    return 8 + int.from_bytes(data[:8], "little")


def addnet_model_hash(data: bytes) -> str:
    """SHA-256 of the tensor data of a serialized safetensors file, header excluded."""
    return hashlib.sha256(memoryview(data)[safetensors_data_offset(data):]).hexdigest()


def addnet_legacy_hash(data: bytes) -> str:
    """First 8 hex digits of the SHA-256 of the 64 KiB at offset 1 MiB."""
    return hashlib.sha256(data[LEGACY_OFFSET:LEGACY_OFFSET + LEGACY_LENGTH]).hexdigest()[:8]


def precalculate_hashes(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> tuple[str, str]:
    """(sshs_model_hash, sshs_legacy_hash) of ``tensors`` saved with the ``ss_*`` metadata."""
    from safetensors.torch import save

    training = {k: v for k, v in metadata.items() if k.startswith("ss_")}
    data = save(dict(tensors), metadata=training)
    return addnet_model_hash(data), addnet_legacy_hash(data)


def add_hashes(metadata: Mapping[str, str], tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """``metadata`` plus ``sshs_model_hash``, ``sshs_legacy_hash`` and ``modelspec.hash_sha256``."""
    model_hash, legacy_hash = precalculate_hashes(tensors, metadata)
    out = dict(metadata)
    out["sshs_model_hash"] = model_hash
    out["sshs_legacy_hash"] = legacy_hash
    out["modelspec.hash_sha256"] = "0x" + model_hash
    return out


def file_hashes(path: str | Path) -> tuple[str, str]:
    """(old 8-digit model hash, full-file SHA-256) of a checkpoint file, read in blocks.

    These are ``ss_sd_model_hash`` / ``ss_new_sd_model_hash`` (and ``ss_vae_hash`` /
    ``ss_new_vae_hash``); compute them once per run, not per save: a checkpoint is gigabytes.
    """
    full = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(LEGACY_OFFSET)
        legacy = hashlib.sha256(f.read(LEGACY_LENGTH)).hexdigest()[:8]
        f.seek(0)
        for block in iter(lambda: f.read(_BLOCK), b""):
            full.update(block)
    return legacy, full.hexdigest()


def legacy_file_hash(path: str | Path) -> str:
    """AUTOMATIC1111's old 8-digit model hash: SHA-256 of the 64 KiB at 1 MiB (cheap)."""
    with open(path, "rb") as f:
        f.seek(LEGACY_OFFSET)
        return hashlib.sha256(f.read(LEGACY_LENGTH)).hexdigest()[:8]


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pt")


def model_short_hash(path: str | Path) -> str:
    """A cheap identity of a base model, recorded with what was trained on it.

    A single file: its legacy hash (what AUTOMATIC1111 shows as ``[abcd1234]``). A diffusers
    folder: the first 8 hex digits of the SHA-256 over the relative names and legacy hashes of
    its weight files, so that two folders with the same weights give the same hash.
    """
    path = Path(path)
    if path.is_file():
        return legacy_file_hash(path)
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.suffix in WEIGHT_SUFFIXES):
        h.update(f"{file.relative_to(path).as_posix()}:{legacy_file_hash(file)}\n".encode())
    return h.hexdigest()[:8]
