"""Host memory that a run frees goes back to the system (glibc's malloc).

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes with a mapping of its own,
returned to the system when it is freed; smaller ones come from the heap, whose freed pages the
process keeps unless they are at its top. The threshold starts at 128 KiB, but glibc raises it
(up to 32 MiB) each time a mapped block is freed: after a run's first freed tensors (a loaded
file's, an encoder's), a CPU step's activations, most of 1 to 32 MiB, come from the heap, one
live tensor above them keeps the freed ones from being trimmed, and the process's memory grows
past what is alive towards the largest heap it ever had. Fixing the threshold (which also turns
the raising off) maps every block of :data:`THRESHOLD` or more on its own, so that freed
tensors leave. Blocks under the threshold (most of Python's objects) stay in the heap, as before.

What it costs: each mapped block's pages are new to the process, so the kernel faults and zeroes
them at first touch, where the heap would have reused pages. On a CPU step that shows where the
step is short against its activations (bench/*_lora_vs_diffusers.py, 2 cores, 256 px):

| threshold | klein 4B-wide, 4 blocks: peak RSS, s/step | Z-Image, 1 layer: peak RSS, s/step |
|---|---|---|
| glibc's own (raised up to 32 MiB) | 5.77 to 5.94 GiB | 2.84 GiB, 2.00 s |
| 8 MiB | 5.30 GiB, 11.17 s | 2.75 GiB, 2.15 s |
| 1 MiB (this) | 4.85 GiB, 11.36 s | 2.63 GiB, 2.27 s |

Memory is what a run on a large model runs out of (a GPU run's steps allocate little host
memory, so there the cost is nil), hence 1 MiB.

Elsewhere than glibc (macOS, musl, Windows) nothing is done: their allocators return large
blocks by themselves or have no such setting.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
THRESHOLD = 1 << 20  # 1 MiB: a block this large is mapped alone; far fewer than vm.max_map_count


def fix_mmap_threshold(size: int = THRESHOLD) -> bool:
    """Set glibc's mmap threshold to ``size`` bytes for this process (see the module's notes);
    whether it was set (False where the C library is not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
        version = getattr(libc, "gnu_get_libc_version", None)
    except OSError:
        return False
    if mallopt is None or version is None:  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, size))
