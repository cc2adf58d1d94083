"""Any ``torch.optim.lr_scheduler`` class as the schedule: sd-scripts' ``--lr_scheduler_type``
with its ``--lr_scheduler_args`` as the keyword arguments (``get_scheduler_fix`` in sd-scripts'
library/train_util.py: a bare name is a class of ``torch.optim.lr_scheduler``, a dotted one
``module.Class`` is imported; the warm-up is refused, as sd-scripts refuses it).

The config layer may not import torch, so the classes and their parameters are written out here
(tests/test_kohya_extra_optim.py holds this table against torch's signatures): a config that
names an unknown class, leaves out a required argument or passes one the class does not take
is refused when it loads, naming the setting. Classes that need Python objects as arguments
(LambdaLR, SequentialLR, ...) or a metric at every step (ReduceLROnPlateau) are not offered.
A dotted name from another package is checked when the run builds it.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

# class -> (required arguments, optional arguments), without optimizer and last_epoch
TORCH_SCHEDULERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ConstantLR": ((), ("factor", "total_iters")),
    "CosineAnnealingLR": (("T_max",), ("eta_min",)),
    "CosineAnnealingWarmRestarts": (("T_0",), ("T_mult", "eta_min")),
    "CyclicLR": (("base_lr", "max_lr"), ("step_size_up", "step_size_down", "mode", "gamma",
                                         "scale_mode", "cycle_momentum", "base_momentum",
                                         "max_momentum")),
    "ExponentialLR": (("gamma",), ()),
    "LinearLR": ((), ("start_factor", "end_factor", "total_iters")),
    "MultiStepLR": (("milestones",), ("gamma",)),
    "OneCycleLR": (("max_lr",), ("total_steps", "epochs", "steps_per_epoch", "pct_start",
                                 "anneal_strategy", "cycle_momentum", "base_momentum",
                                 "max_momentum", "div_factor", "final_div_factor",
                                 "three_phase")),
    "PolynomialLR": ((), ("total_iters", "power")),
    "StepLR": (("step_size",), ("gamma",)),
}


class SchedulerError(ValueError):
    """A custom schedule that cannot be built; the message names the setting."""


def custom_scheduler_problem(section: Any) -> Optional[str]:
    """Why ``optimizer.lr_scheduler_type`` with its ``lr_scheduler_args`` cannot be built, or
    None (checked at load time, without torch)."""
    name = section.lr_scheduler_type
    if name is None:
        return None
    key = f"optimizer.lr_scheduler_type = {name!r}"
    if section.lr_warmup_steps or section.lr_warmup_ratio:
        return (f"{key} has no warm-up of ours (sd-scripts refuses it too): unset "
                f"optimizer.lr_warmup_steps / lr_warmup_ratio")
    if "." in name:
        return None  # another package's class: checked when the run imports it
    if name not in TORCH_SCHEDULERS:
        return (f"{key}: not a schedule of torch.optim.lr_scheduler that takes plain "
                f"arguments; one of {', '.join(TORCH_SCHEDULERS)} (or module.Class)")
    required, optional = TORCH_SCHEDULERS[name]
    args = section.lr_scheduler_args
    missing = [a for a in required if a not in args]
    if missing:
        return (f"{key} needs optimizer.lr_scheduler_args.{missing[0]} (its arguments: "
                f"{', '.join(required + optional)})")
    extra = [a for a in args if a not in required + optional]
    if extra:
        return (f"optimizer.lr_scheduler_args.{extra[0]}: {name} takes no such argument (it "
                f"takes {', '.join(required + optional)})")
    return None


def make_custom_scheduler(section: Any, optimizer: Any) -> Any:
    """The ``torch.optim.lr_scheduler`` class (or ``module.Class``) over ``optimizer``."""
    name = section.lr_scheduler_type
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name or "torch.optim.lr_scheduler")
        cls = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise SchedulerError(f"optimizer.lr_scheduler_type = {name!r} cannot be imported "
                         f"({exc})") from None
    args = {k: list(v) if isinstance(v, tuple) else v
            for k, v in section.lr_scheduler_args.items()}
    try:
        return cls(optimizer, **args)
    except TypeError as exc:
        raise SchedulerError(f"optimizer.lr_scheduler_args for {name!r}: {exc}") from None
