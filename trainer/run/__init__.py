"""One training run, from ``run(cfg, sink, control)`` to its ``Finished`` event.

- :mod:`~trainer.run.loop`: :func:`~trainer.run.loop.run`, the loop a newcomer reads top to bottom;
- :mod:`~trainer.run.session`: the set-up (device, model, method, data, caches, optimizer) and
  the release of it all afterwards;
- :mod:`~trainer.run.step`: one optimizer step (the batch's conditioning, noise, loss, backward);
- :mod:`~trainer.run.outputs`, :mod:`~trainer.run.state`: the saved files and the training state
  that an exact resume reads back;
- :mod:`~trainer.run.validation`, :mod:`~trainer.run.sampling`, :mod:`~trainer.run.class_images`:
  validation loss, sample images, prior-preservation class images;
- :mod:`~trainer.run.failures`: a failed run's message and what to do;
- :mod:`~trainer.run.meter`: the moving-average loss, speed and time left;
- :mod:`~trainer.run.launch`: the same run in several processes through torchrun, whose rank 0
  reports its events back (it lives here, not in :mod:`trainer.system`, because it runs the loop).

May import everything below it: config, system, objectives, optim, data, models, methods,
export. Nothing below imports it (a test checks).
"""
