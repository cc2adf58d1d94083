"""The training engine. See trainer/loop.py for the entry point, ``run(cfg, sink, control)``."""

from trainer.lazy_imports import defer_bitsandbytes

defer_bitsandbytes()
