"""The C heap of a CPU run's steps (``training.cpu_freed_memory``): what becomes of the large
blocks a step frees.

glibc's malloc maps each block above its mmap threshold on its own and unmaps it when it is
freed; it raises that threshold to the size of each mapped block freed, up to 32 MiB, so that
blocks of the sizes a program keeps freeing come from its heap, which keeps the largest size it
reached. A CPU step's largest tensors are above 32 MiB (FLUX.2 [klein] 4B's fused single-block
projection at 768 tokens is 85 MB in fp32, and its gradients as much): every step has the kernel
map, zero and fault in those pages anew, about 340,000 page faults and 1 of the 20 CPU seconds of
a step of bench/flux2_klein_lora_vs_diffusers.py's model. The modes:

- ``"glibc"`` (the default): as above.
- ``"reuse"`` (:func:`keep_freed_blocks`): ``M_MMAP_MAX`` 0 and ``M_TRIM_THRESHOLD`` at its
  largest (2 GiB). Every block comes from the heap, and the blocks a step frees serve the next
  step's tensors (about 1,000 faults a step after the first), as a GPU's caching allocator reuses
  device memory and as jemalloc or tcmalloc do under Intel's CPU launcher. On that model 3 to 7%
  faster steps for about the same peak RSS (the heap's fragmentation keeps pages that glibc's
  mapping would give back); under regional compile it raised the peak.
- ``"return"`` (:func:`return_freed_blocks`): ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``
  fixed at 128 KiB, glibc's starting values, which it then no longer raises: every block above
  it is mapped on its own and leaves the process when freed, and the heap's top is trimmed. On
  that model about 10% less peak RSS (4.83 GiB against 5.28) for about 8% slower steps (9.16
  against 8.51 s).

:meth:`HeapMode.restore` ends either when the run ends (the web UI's process lives on) and
returns the free pages. glibc has no call that makes a threshold dynamic again once ``mallopt``
has set one (any of these does), so the restored state is the one its dynamic rule reaches in a
training process: a 32 MiB mmap threshold and a 64 MiB trim threshold, with mapping allowed.

Left alone: a heap that the environment configures (a ``MALLOC_..._`` variable of glibc's, such
as ``MALLOC_MMAP_THRESHOLD_=1048576``, or ``GLIBC_TUNABLES``), and any C library without
glibc's ``mallopt`` (macOS, Windows, musl). A training thread other than the main one (the web
UI's) has its own arena, where glibc maps blocks over 64 MiB whatever the mode.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass
from typing import Optional

# glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
DEFAULT_MMAP_MAX = 65536
KEPT_TRIM_THRESHOLD = 2**31 - 1  # mallopt's int: no trim below 2 GiB of free heap top
RETURN_THRESHOLD = 128 * 1024  # glibc's starting mmap threshold
# where glibc's dynamic rule settles once a program has freed mapped blocks of 32 MiB (its
# DEFAULT_MMAP_THRESHOLD_MAX on 64-bit) and sets the trim threshold to twice that
SETTLED_MMAP_THRESHOLD, SETTLED_TRIM_THRESHOLD = 32 * 2**20, 64 * 2**20
MODES = ("glibc", "reuse", "return")
WHAT_MODES_DO = {  # the run's log line
    "reuse": "the steps reuse the blocks they free instead of mapping them anew",
    "return": "every block over 128 KiB that a step frees goes back to the system at once",
}
ENVIRONMENT = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
               "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_",
               "GLIBC_TUNABLES")


@functools.lru_cache(maxsize=1)
def glibc() -> Optional[ctypes.CDLL]:
    """The process's C library where it is glibc (``mallopt``, ``malloc_trim``), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") \
        and hasattr(libc, "malloc_trim") and hasattr(libc, "gnu_get_libc_version") else None


def give_back_free_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``; elsewhere
    nothing): weights smaller than malloc's mapping threshold live in the heap, and freeing
    them alone leaves the process's memory as it was."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


def environment_setting(environ: Optional[dict] = None) -> Optional[str]:
    """The first glibc malloc variable that the environment sets, else None."""
    environ = os.environ if environ is None else environ
    return next((name for name in ENVIRONMENT if environ.get(name)), None)


@dataclass
class HeapMode:
    """glibc's heap in a mode of ``training.cpu_freed_memory``; :meth:`restore` ends it."""

    libc: ctypes.CDLL
    mode: str
    active: bool = True

    def restore(self) -> None:
        """glibc's settled settings back (the module's docstring says which), and the heap's
        free pages returned to the system."""
        if not self.active:
            return
        self.active = False
        self.libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        self.libc.mallopt(M_MMAP_THRESHOLD, SETTLED_MMAP_THRESHOLD)
        self.libc.mallopt(M_TRIM_THRESHOLD, SETTLED_TRIM_THRESHOLD)
        give_back_free_memory()


def _settable(backend: str, environ: Optional[dict]) -> Optional[ctypes.CDLL]:
    if backend != "cpu" or environment_setting(environ):
        return None
    return glibc()


def keep_freed_blocks(backend: str, environ: Optional[dict] = None) -> Optional[HeapMode]:
    """``"reuse"``: on the CPU backend with glibc, the heap keeps freed blocks until
    :meth:`HeapMode.restore`; None where nothing changed (another backend, another C library,
    or the environment's own malloc settings)."""
    libc = _settable(backend, environ)
    if libc is None or not libc.mallopt(M_MMAP_MAX, 0):
        return None
    libc.mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)
    return HeapMode(libc, "reuse")


def return_freed_blocks(backend: str, environ: Optional[dict] = None) -> Optional[HeapMode]:
    """``"return"``: on the CPU backend with glibc, every block above 128 KiB is mapped on its
    own and unmapped when freed, until :meth:`HeapMode.restore`; None where nothing changed."""
    libc = _settable(backend, environ)
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, RETURN_THRESHOLD):
        return None
    # the trim threshold too, which glibc's rule may have raised to 64 MiB during the set-up
    libc.mallopt(M_TRIM_THRESHOLD, RETURN_THRESHOLD)
    return HeapMode(libc, "return")


def set_mode(mode: str, backend: str, environ: Optional[dict] = None) -> Optional[HeapMode]:
    """Put glibc's heap in ``mode`` (one of :data:`MODES`); None for ``"glibc"`` and where
    nothing changed."""
    if mode not in MODES:
        raise ValueError(f"training.cpu_freed_memory = {mode!r}: use one of {', '.join(MODES)}")
    if mode == "glibc":
        return None
    return (keep_freed_blocks if mode == "reuse" else return_freed_blocks)(backend, environ)
