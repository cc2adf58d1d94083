"""The sections of the config schema, one module each; ``trainer.config`` puts them
together into ``TrainConfig`` and is the module to import from."""
