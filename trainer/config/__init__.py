"""The config: the one schema, its files and its rules. The floor of the trainer.

- :mod:`~trainer.config.schema` puts :class:`TrainConfig` together from the sections in
  :mod:`trainer.config.sections` (one module per TOML section; each field declared once, with
  its type, default, bounds, help and UI hints);
- :mod:`~trainer.config.files`: TOML load and dump, ``--set`` overrides, ``config_example.toml``;
- :mod:`~trainer.config.rules`: the checks across fields and modes, run when a config loads;
- :mod:`~trainer.config.paths`: the project's folders and the studio's data folder;
- :mod:`~trainer.config.plan`: the step arithmetic (images x repeats / batch -> steps) that the
  run, the importers, the advisor and the GUI share.

May import: pydantic, tomllib/tomli-w and the optimizer table of :mod:`trainer.optim.optimizers`
(light: no torch). Never torch, diffusers or anything above it: the GUI builds its form from here
in a process that may never train. Modules inside import their siblings, not this package.
"""

from trainer.config.schema import (  # noqa: F401 - the schema's public names
    EMBEDDED_DATASET,
    EMBEDDED_FLUX,
    EMBEDDED_MODEL,
    EMBEDDED_SD3,
    EMBEDDED_SDXL,
    FAMILIES,
    MODES,
    SCHEMA_VERSION,
    SECTIONS,
    DatasetSection,
    FlowSection,
    Mode,
    ModelSection,
    NetworkSection,
    NetworkType,
    OptimizerName,
    OptimizerSection,
    SamplingSection,
    SavingSection,
    SchedulerName,
    Section,
    TrainConfig,
    TrainingSection,
    Widget,
    iter_fields,
    setting,
    ui_hints,
)
