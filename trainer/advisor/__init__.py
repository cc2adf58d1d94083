"""Before a run: memory and time estimates on the detected device, and advice.

- :mod:`~trainer.advisor.estimate`: ``advise(cfg, info)``, the step arithmetic, the peak memory
  phase by phase and the time per step;
- :mod:`~trainer.advisor.footprint`: one training step simulated on the meta device (no weight
  loaded), its live bytes and operations; :mod:`~trainer.advisor.model_configs` reads the
  component configs it builds from;
- :mod:`~trainer.advisor.rules`: the devices' throughput and the recommendations;
- :mod:`~trainer.advisor.advice`: the records the estimate fills;
- :mod:`~trainer.advisor.report`: those records in words, and ``python -m trainer advise``.

May import config, system, optim, data, models and methods (to prepare the simulated model as a
run would); never the run itself.
"""
