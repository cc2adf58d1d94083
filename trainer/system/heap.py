"""The C heap of a CPU run: a step's freed blocks kept for the next step
(``training.cpu_reuse_freed_memory``).

glibc's malloc maps each block above its mmap threshold (which it raises as mapped blocks are
freed, up to 32 MiB) on its own, and unmaps it when it is freed. A CPU step's largest tensors
are above that: FLUX.2 [klein] 4B's fused single-block projection at 768 tokens is 85 MB in
fp32, and its gradients as much. So every step has the kernel map, zero and fault in those
pages anew: about 340,000 page faults and 1 of the 20 CPU seconds of a step of
bench/flux2_klein_lora_vs_diffusers.py's model.

:func:`keep_freed_blocks` sets glibc's ``M_MMAP_MAX`` to 0 and its ``M_TRIM_THRESHOLD`` to its
largest (2 GiB): every block comes from the heap, and the blocks a step frees serve the next
step's tensors (about 1,000 faults a step after the first), as a GPU's caching allocator reuses
device memory and as jemalloc or tcmalloc do under Intel's CPU launcher. On that model it
saved 3 to 7% of a step (10.1 to 9.8 s) for about the same peak RSS (5.3 to 5.5 GiB either
way: the heap's fragmentation keeps pages that glibc's mapping would give back); under
regional compile it raised the peak. Hence a setting, off by default.
:meth:`KeptHeap.restore` puts glibc's defaults back and returns the free pages when the run
ends (the web UI's process lives on).

Left alone: a heap that the environment configures (a ``MALLOC_..._`` variable of glibc's, such
as ``MALLOC_MMAP_THRESHOLD_=1048576``, or ``GLIBC_TUNABLES``), and any C library without
glibc's ``mallopt`` (macOS, Windows, musl). A training thread other than the main one (the web
UI's) keeps blocks under 64 MiB; glibc maps larger ones there whatever the setting.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass
from typing import Optional

# glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536
KEPT_TRIM_THRESHOLD = 2**31 - 1  # mallopt's int: no trim below 2 GiB of free heap top
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
class KeptHeap:
    """glibc's heap while it keeps freed blocks; :meth:`restore` ends that."""

    libc: ctypes.CDLL
    active: bool = True

    def restore(self) -> None:
        """glibc's defaults back, and the heap's free pages returned to the system."""
        if not self.active:
            return
        self.active = False
        self.libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        self.libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        give_back_free_memory()


def keep_freed_blocks(backend: str, environ: Optional[dict] = None) -> Optional[KeptHeap]:
    """On the CPU backend with glibc, the heap keeps freed blocks until :meth:`KeptHeap.restore`;
    None where nothing changed (another backend, another C library, or the environment's own
    malloc settings)."""
    if backend != "cpu" or environment_setting(environ):
        return None
    libc = glibc()
    if libc is None:
        return None
    if not libc.mallopt(M_MMAP_MAX, 0):
        return None
    libc.mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)
    return KeptHeap(libc)
