"""[training] options of the trackers that receive the run's logs (TensorBoard, Weights & Biases,
through accelerate's trackers as sd-scripts' --log_with): where they go and what the run is
called there."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import Section, setting


class Trackers(Section):
    """The tracker options, mixed into :class:`trainer.config.sections.training.TrainingSection`."""

    log_with: Literal["none", "tensorboard", "wandb", "all"] = setting(
        "tensorboard", "Where the training logs go, under logging_dir: TensorBoard, Weights & "
        "Biases (wandb; WANDB_MODE=offline works without an account) or all (both), as "
        "sd-scripts' --log_with.", advanced=True,
        label="Logging",
    )
    logging_dir: Optional[str] = setting(
        None, "Folder of the TensorBoard logs; unset uses logs inside output_dir.",
        advanced=True, widget="dir",
        label="Log folder",
    )
    log_tracker_name: Optional[str] = setting(
        None, "Name of the run in the trackers: TensorBoard's folder under logging_dir and the "
        "W&B project (sd-scripts' --log_tracker_name); unset: saving.output_name.",
        advanced=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$", label="Tracker run name",
    )
    wandb_run_name: Optional[str] = setting(
        None, "Name of the W&B run (sd-scripts' --wandb_run_name); unset: W&B picks one.",
        advanced=True, label="W&B run name",
    )
    log_tracker_config: Optional[str] = setting(
        None, "A TOML file of tracker init arguments, one table per tracker ([wandb] tags, "
        "notes, entity...; [tensorboard] flush_secs...), passed to accelerate's init_trackers "
        "(sd-scripts' --log_tracker_config); its values win over the W&B run name and folder.",
        advanced=True, widget="file", label="Tracker arguments file",
    )
