"""The advisor's simulations kept on disk, so that an estimate the machine has made once answers
at once in every later process (the GUI started again, ``python -m trainer advise``).

A simulation of a full-size UNet step on the meta device takes seconds to tens of seconds on a
CPU (most of it dispatching operations); a step's law (:mod:`trainer.advisor.law`) takes two,
and is a few kilobytes of terms. They are kept in ``<data home>/cache/advisor.json`` under
their key (model shape, mode, network, dtype, checkpointing; the resolution and batch for a
step simulated at them) plus a stamp of what could change them: the versions of torch,
diffusers, peft and transformers and the advisor's own simulation code. A file that cannot be
read is ignored and rewritten; writes are atomic. In-process, answers are also kept in memory
(:func:`trainer.advisor.model_configs.cached`), and the laws shipped with the studio for the
families' models come before the disk (:mod:`trainer.advisor.shipped`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

from trainer.advisor.model_configs import cached, forget

T = TypeVar("T")
_LOCK = threading.Lock()
_STAMP: list[str] = []
CODE = ("footprint.py", "flow_memory.py", "disk_cache.py", "law.py", "law_keys.py",
        "live_bytes.py")


def cache_file() -> Path:
    from trainer.config.paths import data_home

    return data_home() / "cache" / "advisor.json"


def _stamp() -> str:
    if not _STAMP:  # the versions without importing the libraries (seconds each)
        from importlib.metadata import version

        h = hashlib.sha256(" ".join(version(n) for n in ("torch", "diffusers", "peft",
                                                         "transformers")).encode())
        for name in CODE:
            h.update((Path(__file__).parent / name).read_bytes())
        _STAMP.append(h.hexdigest()[:16])
    return _STAMP[0]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def stored(key: str, build: Callable[[], T], to_json: Callable[[T], Any] = lambda v: v,
           from_json: Callable[[Any], T] = lambda v: v, model: Optional[str] = None,
           simulate: bool = True) -> Optional[T]:
    """``build()``'s value for ``key``: from memory, else from what is shipped for ``model``
    (a ``ModelConfigs.key``, :mod:`trainer.advisor.shipped`), else from the disk cache, else
    built and written there; None instead of building without ``simulate``."""
    def name() -> str:  # the library versions are read only when the disk is
        return hashlib.sha256((_stamp() + key).encode()).hexdigest()

    def known() -> Any:
        from trainer.advisor import shipped

        sources = (lambda: shipped.lookup(model, key) if model else shipped.MISSING,
                   lambda: _read(cache_file()).get(name(), shipped.MISSING))
        for source in sources:
            found = source()
            if found is not shipped.MISSING:
                try:
                    return from_json(found)
                except (TypeError, ValueError, KeyError):
                    pass  # an entry of another shape: build it again
        return shipped.MISSING

    def load_or_build() -> T:
        from trainer.advisor.shipped import MISSING
        from trainer.system.safe_write import atomic_path

        value = known()
        if value is not MISSING:
            return value
        value = build()
        path = cache_file()
        with _LOCK:
            entries = _read(path)
            entries[name()] = to_json(value)
            try:
                with atomic_path(path) as tmp:
                    tmp.write_text(json.dumps(entries), encoding="utf-8")
            except OSError:
                pass  # a read-only data folder: the estimate still stands
        return value
    if simulate:
        return cached(key, load_or_build)
    from trainer.advisor.shipped import MISSING

    found = cached(key, lambda: known())
    if found is MISSING:
        forget(key)
        return None
    return found
