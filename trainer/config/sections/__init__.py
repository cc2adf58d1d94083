"""The sections of the config schema, one module each; :mod:`trainer.config.schema` puts them
together into ``TrainConfig``, which is imported from :mod:`trainer.config`."""
