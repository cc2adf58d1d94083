"""The exponential moving average of the trained weights (trainer/run/ema.py; OneTrainer and
SimpleTuner have it, sd-scripts does not): its decay in [training], and in [saving] whether the
files and samples use it."""

from __future__ import annotations

from typing import Optional

from trainer.config.sections.base import Section, setting


class TrainingEMA(Section):
    """[training]: the EMA kept while training."""

    ema_decay: Optional[float] = setting(
        None, "Keep an exponential moving average of the trained weights with this decay "
        "(0.999 is common; OneTrainer and SimpleTuner have it, sd-scripts does not); "
        "saving.use_ema_weights says whether files and samples use it. Unset: no EMA.",
        advanced=True, gt=0, lt=1, label="EMA decay",
    )
    ema_warmup: bool = setting(
        True, "Ramp the EMA decay up as 1 - n^(-2/3) at the n-th update, capped at ema_decay, "
        "so that the initial weights do not dominate the average (diffusers' EMAModel "
        "use_ema_warmup, as SimpleTuner uses it); off: ema_decay from the first update.",
        advanced=True, label="EMA warm-up",
    )


class SavingEMA(Section):
    """[saving]: which weights the files and samples hold when an EMA is kept."""

    use_ema_weights: bool = setting(
        True, "With training.ema_decay: the saved files and the sample images use the EMA "
        "weights (the training state keeps both); off: the trained weights.", advanced=True,
        label="Save and sample the EMA weights",
    )
