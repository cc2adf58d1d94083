"""Optimizers and learning-rate schedules.

- :mod:`~trainer.optim.optimizers`: the optimizers by sd-scripts' names, each built from its
  authors' package, the schedules, and the pairs that cannot work (read by the config's rules,
  so its top level stays light: no torch);
- :mod:`~trainer.optim.lr`: what the loop needs besides (the learning rate an adaptive optimizer
  really uses, schedule-free's averaged weights).

May import the config and :mod:`trainer.system`; nothing of the run.
"""
