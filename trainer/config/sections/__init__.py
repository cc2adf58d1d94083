"""The sections of the config schema, one module each, and ``SECTIONS`` (the TOML section name
of each); :mod:`trainer.config.schema` puts them together into ``TrainConfig``, which is
imported from :mod:`trainer.config`."""

from trainer.config.sections.base import Section
from trainer.config.sections.dataset import DatasetSection
from trainer.config.sections.flow import FlowSection
from trainer.config.sections.model import ModelSection
from trainer.config.sections.network import NetworkSection
from trainer.config.sections.optimizer import OptimizerSection
from trainer.config.sections.outputs import SamplingSection, SavingSection
from trainer.config.sections.training import TrainingSection

SECTIONS: dict[str, type[Section]] = {
    "model": ModelSection,
    "dataset": DatasetSection,
    "network": NetworkSection,
    "optimizer": OptimizerSection,
    "training": TrainingSection,
    "flow": FlowSection,
    "sampling": SamplingSection,
    "saving": SavingSection,
}
