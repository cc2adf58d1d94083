"""bitsandbytes is imported only when an 8-bit or paged optimizer is chosen.

diffusers and peft import bitsandbytes as soon as it is installed (for quantized models, which
the studio does not load). Its import costs a fraction of a second, and on CPUs with AVX512-BF16
it tries to fetch a kernel from the Hugging Face Hub and logs "Failed to load CPU
gemm_4bit_forward from kernels-community" at every start. A ``None`` entry in ``sys.modules``
is Python's own way to mark a module as not importable: ``importlib.util.find_spec`` then
answers None, so both libraries see no bitsandbytes. :func:`import_bitsandbytes` lifts the mark
when an optimizer needs the package.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

NAME = "bitsandbytes"
# Set to 1 to let diffusers and peft import bitsandbytes themselves (quantized base models).
ENV_EAGER = "KOHYA_STUDIO_EAGER_BITSANDBYTES"


def defer_bitsandbytes() -> bool:
    """Hide bitsandbytes from the libraries imported after this; True when it was hidden."""
    if os.environ.get(ENV_EAGER) == "1" or NAME in sys.modules:
        return False  # already imported (or wanted): nothing to save
    sys.modules[NAME] = None  # type: ignore[assignment]
    return True


def import_bitsandbytes() -> Any:
    """The bitsandbytes module, importing it now if it was deferred."""
    if NAME in sys.modules and sys.modules[NAME] is None:
        del sys.modules[NAME]
    return importlib.import_module(NAME)
