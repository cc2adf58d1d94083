"""Before a run: memory and time estimates on the detected device, and advice.

- :mod:`~trainer.advisor.estimate`: ``advise(cfg, info)``, the step arithmetic, the peak memory
  phase by phase and the time per step;
- :mod:`~trainer.advisor.footprint`: one training step simulated on the meta device (no weight
  loaded), its live bytes and operations (:mod:`~trainer.advisor.live_bytes`);
  :mod:`~trainer.advisor.model_configs` reads the component configs it builds from;
- :mod:`~trainer.advisor.law`: two such simulations as a law of the bucket, the batch and the
  LoRA rank (:mod:`~trainer.advisor.law_keys`: what a law is kept under), so that one answers
  every later question; :mod:`~trainer.advisor.shipped` holds them made in advance for the
  families' models (``trainer/assets/advisor``; :mod:`~trainer.advisor.make_shipped` makes
  them), :mod:`~trainer.advisor.disk_cache` the others once made;
- :mod:`~trainer.advisor.flow_memory` and :mod:`~trainer.advisor.flow_advice`: FLUX.1 and SD 3.5
  with their memory options; :mod:`~trainer.advisor.edit_sequence`: what an edit model's
  control images add to a step's sequence and to the text encoder's;
- :mod:`~trainer.advisor.rules`: the devices' throughput and the recommendations;
- :mod:`~trainer.advisor.advice`: the records the estimate fills;
- :mod:`~trainer.advisor.report`: those records in words, and ``python -m trainer advise``.

May import config, system, optim, data, models and methods (to prepare the simulated model as a
run would); never the run itself.
"""
