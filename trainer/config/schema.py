"""The one config schema. Every setting of the studio is declared once, in a module of
``trainer/config/sections/`` per section, and put together here; import it from ``trainer.config``.

TOML files, CLI overrides (``--set optimizer.learning_rate=2e-4``), presets, the GUI form and
``config_example.toml`` all go through :class:`TrainConfig`. Each field carries its type, its
default, its bounds, a one-line help text and UI hints (``label``: the name a person reads, shown
above the field with the TOML key beside it; ``modes``: the training modes that use it;
``advanced``: shown in the closed part of its section; ``widget``: a special editor such as a
folder path). Optional fields default to ``None`` (``None`` means off); a ``0`` is always a value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainer.config.sections import SECTIONS  # noqa: F401
from trainer.config.sections.base import (  # noqa: F401 - the schema's public names
    EMBEDDED_DATASET,
    EMBEDDED_FLUX,
    EMBEDDED_MODEL,
    EMBEDDED_SD3,
    EMBEDDED_SDXL,
    FAMILIES,
    MODES,
    SCHEMA_VERSION,
    Mode,
    Section,
    Widget,
    setting,
)
from trainer.config.sections.dataset import DatasetSection
from trainer.config.sections.flow import FlowSection
from trainer.config.sections.model import ModelSection
from trainer.config.sections.network import NetworkSection, NetworkType  # noqa: F401
from trainer.config.sections.optimizer import (  # noqa: F401
    OptimizerName,
    OptimizerSection,
    SchedulerName,
)
from trainer.config.sections.outputs import SamplingSection, SavingSection
from trainer.config.sections.training import TrainingSection


class TrainConfig(BaseModel):
    """A whole training job."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    schema_version: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    mode: Mode = setting("lora", "What is trained: a LoRA, the whole model, or an embedding.",
                         label="Training mode")
    model: ModelSection = Field(default_factory=ModelSection)
    dataset: DatasetSection = Field(default_factory=DatasetSection)
    network: NetworkSection = Field(default_factory=NetworkSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    flow: FlowSection = Field(default_factory=FlowSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    saving: SavingSection = Field(default_factory=SavingSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        ds = self.dataset
        if ds.min_bucket_reso > ds.max_bucket_reso:
            raise ValueError(
                f"dataset.min_bucket_reso ({ds.min_bucket_reso}) is larger than "
                f"dataset.max_bucket_reso ({ds.max_bucket_reso})"
            )
        if self.network.conv_alpha is not None and self.network.conv_dim is None:
            raise ValueError("network.conv_alpha is set but network.conv_dim is not: set both")
        from trainer.config.rules import check

        check(self)
        return self


def iter_fields() -> list[tuple[str, str, Any]]:
    """(section, name, FieldInfo) of every setting, in declaration order; section '' is top."""
    out: list[tuple[str, str, Any]] = [("", "mode", TrainConfig.model_fields["mode"])]
    for section, cls in SECTIONS.items():
        for name, info in cls.model_fields.items():
            out.append((section, name, info))
    return out


def ui_hints(info: Any) -> dict[str, Any]:
    """The UI hints (modes, advanced, widget) of a field."""
    extra = info.json_schema_extra or {}
    return dict(extra.get("ui", {"modes": list(MODES), "advanced": False}))
