"""One thread at a time builds models from the ML libraries, in a process that runs several.

diffusers and transformers are lazy packages: their ``__init__`` (and that of each subpackage,
such as ``transformers.models.clip`` or ``diffusers.pipelines``) replaces itself in
``sys.modules`` with a ``_LazyModule`` that imports a class on first use. Python's import locks
do not cover that swap: a second thread that imports the package while the first is still in
its ``__init__`` can get the half-built module, and then ``from diffusers import
StableDiffusionPipeline`` fails with ``ImportError: cannot import name`` (seen in the GUI: the
memory estimate of a tab and a DreamBooth run started at once, in a fresh studio).

So the work that imports those classes for the first time runs under :data:`LIBRARIES`: the
advisor's estimate, loading or building a base model, putting the method's modules on it,
building a sampling pipeline. The lock is taken at the top of such work, never inside a
library's import, so it cannot deadlock with Python's own module locks; it is re-entrant, since
one such step may call another. A single-threaded run (the CLI) takes it without waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

LIBRARIES = threading.RLock()


@contextmanager
def library_imports() -> Iterator[None]:
    """Hold :data:`LIBRARIES` for the block."""
    with LIBRARIES:
        yield
