"""The training engine. See trainer/run/loop.py for the entry point, ``run(cfg, sink, control)``."""

from trainer.system.lazy_imports import defer_bitsandbytes
from trainer.system.quiet import quiet_third_party

defer_bitsandbytes()
quiet_third_party()
