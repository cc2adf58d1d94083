"""Keep known-harmless third-party chatter out of the studio's output, at debug level instead.

A normal run printed, besides the studio's own lines, what the user can do nothing about:

- transformers' "Loading weights" and "Writing model shards" progress bars on every model load
  and save (the studio reports loading in its own words);
- transformers' warning that an image processor falls back to its PIL version because
  torchvision is not installed (the studio does not install torchvision, and training does not
  use image processors; captioning works with the PIL version);
- bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community", logged on CPUs
  with AVX512-BF16 when it is imported for an 8-bit optimizer: an optional faster kernel from
  the Hugging Face Hub for 4-bit matmuls, which the 8-bit optimizers do not use.

Each record in :data:`KNOWN` becomes a DEBUG record: it is shown where that logger is enabled for
DEBUG (``TRANSFORMERS_VERBOSITY=debug`` for transformers, ``logging.DEBUG`` on the root logger
for the others), dropped otherwise. The progress bars stay on with
``TRANSFORMERS_VERBOSITY=info`` or ``debug``, or ``HF_HUB_DISABLE_PROGRESS_BARS=0``. Anything
not listed is left alone: an unknown warning may matter.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass

VERBOSE = ("info", "debug", "detail")


@dataclass(frozen=True)
class Known:
    logger: str  # the logger that emits it (its module's __name__)
    pattern: str  # a regular expression that the message must match (re.search)
    why: str  # why it is harmless here


KNOWN = (
    Known("transformers.utils.import_utils",
          r"requires torchvision \(not installed\); falling back",
          "the PIL image processors do the same work; training uses no image processor"),
    Known("bitsandbytes.backends.cpu.ops", r"gemm_4bit_forward from kernels-community",
          "an optional Hub kernel for 4-bit matmuls; the 8-bit optimizers do not use it"),
)


class Demote(logging.Filter):
    """Turns the records whose message matches `pattern` into DEBUG records, which pass only
    where the logger is enabled for DEBUG."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not self.pattern.search(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_third_party() -> None:
    """Install the filters of :data:`KNOWN` (once) and turn off the libraries' progress bars
    unless the user asked for more output. Cheap: it imports none of those libraries (a logger's
    filter set now stays when the library later fetches its logger by the same name)."""
    for known in KNOWN:
        logger = logging.getLogger(known.logger)
        if not any(isinstance(f, Demote) and f.pattern.pattern == known.pattern
                   for f in logger.filters):
            logger.addFilter(Demote(known.pattern))
    if os.environ.get("TRANSFORMERS_VERBOSITY", "").lower() in VERBOSE:
        return
    # read by huggingface_hub when it is imported, and through it by transformers
    if os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1") != "1":
        return  # the user's own setting
    # imported before the trainer (the variable is read once, at import)
    hub = sys.modules.get("huggingface_hub.utils")
    if hub is not None:
        hub.disable_progress_bars()
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        transformers_logging.disable_progress_bar()
