"""kohya_ss keys of issue 21's second half (captions, noise, schedules, samples, metadata...):
their rules, kept apart from ``kohya_table.py`` (which merges them into ``DIRECT``) so that
neither table grows past a screen. Pure data and converters: no handler lives here.
"""

from __future__ import annotations

from typing import Any, get_args

from trainer.config.sections.outputs import SamplingSection
from trainer.importers import kohya_convert as c

# sd-scripts' sampler spellings -> ours (library/train_util.py get_my_scheduler)
SAMPLER_NAMES: dict[str, str] = {
    **{n: n for n in get_args(SamplingSection.model_fields["sample_sampler"].annotation)},
    "k_lms": "lms", "k_euler": "euler", "k_euler_a": "euler_a", "k_dpm_2": "dpm_2",
    "k_dpm_2_a": "dpm_2_a",
}


# Optimizers that kohya_ss users name without their package: the import path of the class
# (CAME, Luo et al. 2023: the authors' package came-pytorch)
CLASS_PATHS = {"CAME": "came_pytorch.CAME"}


def optimizer_target(name: Any) -> tuple[str, str]:
    """(our key, value): sd-scripts' --optimizer_type also takes ``module.Class``, which is
    optimizer.optimizer_class here."""
    name = CLASS_PATHS.get(str(name), str(name))
    return ("optimizer.optimizer_class" if "." in name else "optimizer.optimizer_type"), name


def token_length(value: Any) -> Any:
    """kohya_ss's max_token_length: 75 (its default) is CLIP's own window, i.e. unset here."""
    n = c.to_int(value)
    return c.UNSET if n is c.UNSET or n in (0, 75) else n


# kohya key -> (our dotted key, converter); kohya_table.DIRECT takes them as Rules
EXTRA_DIRECT: dict[str, tuple[str, Any]] = {
    "ip_noise_gamma": ("training.ip_noise_gamma", c.nonzero(c.to_float)),
    "ip_noise_gamma_random_strength": ("training.ip_noise_gamma_random_strength", c.to_bool),
    "v_pred_like_loss": ("training.v_pred_like_loss", c.nonzero(c.to_float)),
    "weighted_captions": ("dataset.weighted_captions", c.to_bool),
    "max_token_length": ("dataset.max_token_length", token_length),
    "caption_dropout_every_n_epochs": ("dataset.caption_dropout_every_n_epochs",
                                       c.nonzero(c.to_int)),
    "no_token_padding": ("dataset.no_token_padding", c.to_bool),
    "training_comment": ("saving.training_comment", c.to_text),
    "metadata_tags": ("saving.metadata_tags", c.to_text),
}
