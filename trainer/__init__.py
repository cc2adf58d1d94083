"""The training engine. See trainer/run/loop.py for the entry point, ``run(cfg, sink, control)``."""

from trainer.system.lazy_imports import defer_bitsandbytes

defer_bitsandbytes()
