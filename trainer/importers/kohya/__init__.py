"""The kohya_ss importer: a kohya_ss GUI JSON config (github.com/bmaltais/kohya_ss) or preset as
a validated :class:`~trainer.config.TrainConfig`, with the report of what became of every key.

    from trainer.importers.kohya import import_kohya_file
    cfg, report = import_kohya_file("my_lora.json")

:mod:`.importer` is the entry point (these names, imported on first use so that a module of
the package, e.g. a family's ``kohya`` role reading :mod:`.convert`, loads without the rest);
:mod:`.table` the keys that map one to one, :mod:`.derived` those read together. A family's
own keys (its switch, its component files, its flow-matching settings) live in its folder:
``trainer/families/<folder>/kohya.py``, read through :mod:`.families`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ImportReport", "detect_mode", "import_kohya", "import_kohya_file", "read_json"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainer.importers.kohya import importer

        return getattr(importer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
