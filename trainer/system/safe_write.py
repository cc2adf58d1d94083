"""Write files so that a crash never leaves a half-written file under the final name.

The data goes to a temporary file in the same folder (so the final rename stays on one file
system), is flushed to disk, and only then replaces the final name with ``os.replace``, which is
atomic on POSIX and Windows. A crash or an exception before the rename leaves the earlier file of
that name untouched; an exception removes the temporary file. Temporary names start with a dot
and end in ``.tmp``, so no UI lists them as models.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file


def _fsync(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable where the platform allows (not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _default_mode() -> int:
    """0o666 less the umask: the mode ``open()`` would have given the file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on a clean exit it becomes ``path``.

    >>> with atomic_path("out/last.safetensors") as tmp:
    ...     write_something(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fsync(tmp)
        os.chmod(tmp, _default_mode())  # mkstemp makes it private (0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def save_safetensors_atomic(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Optional[Mapping[str, str]] = None,
) -> Path:
    """Save ``tensors`` (and string ``metadata``) as safetensors at ``path``, atomically."""
    meta = dict(metadata or {})
    bad = sorted(k for k, v in meta.items() if not isinstance(k, str) or not isinstance(v, str))
    if bad:
        raise TypeError(f"safetensors metadata values must be strings: {', '.join(bad)}")
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(dict(tensors), str(tmp), metadata=meta or None)
    return path


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on a clean exit it replaces ``path``.

    A folder cannot be swapped in one step: the old one is first renamed aside, the new one
    takes its name, then the old one is deleted. A crash leaves either the old folder or the
    new one under the final name (and at worst a hidden ``.<name>.old-*`` folder beside it).
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            old.rmdir()
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(path.parent)
