"""Child processes that end with their parent: Linux's ``PR_SET_PDEATHSIG``.

When the studio's GUI (or a ``python -m trainer`` run) is killed with SIGKILL, by the out-of-memory
killer or by a closed terminal, nothing of it runs to stop what it started. A child that asked
for a parent-death signal gets that signal from the kernel the moment its parent ends, so no
orphan keeps the device. Elsewhere (macOS, Windows) these are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable
from typing import Optional

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: Optional[int] = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent ends; if the parent
    (``parent``, the pid it had when this process was started) is already gone, send it now.
    Returns whether the request was made."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), sig)
    return True


def preexec(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``subprocess.Popen(preexec_fn=...)`` that makes the child end with this process."""
    parent = os.getpid()

    def run() -> None:
        die_with_parent(sig, parent)

    return run
