"""Optimizers and learning-rate schedules, by name, from the config.

The names are sd-scripts' ``--optimizer_type`` spellings (kohya_ss presets use them), each built
from its authors' package: torch, bitsandbytes (the 8-bit and paged ones), lion-pytorch,
transformers (Adafactor), prodigyopt, dadaptation (D-Adaptation, Defazio & Mishchenko 2023) and
schedulefree (Defazio et al. 2024). ``optimizer.optimizer_args`` passes through as keyword
arguments, over sd-scripts' defaults (momentum 0.9 for the Nesterov SGDs, for instance).

The combinations that cannot work are refused when the config loads
(:func:`optimizer_problems`); :mod:`trainer.optim.lr` has what the loop needs besides
(the learning rate the adaptive optimizers really use, schedule-free's eval weights).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Optional

# Backends on which bitsandbytes' 8-bit optimizers run (0.45+ has CPU, ROCm and XPU support;
# the paged ones fall back to ordinary memory on the CPU).
BNB_BACKENDS = ("cuda", "rocm", "xpu", "cpu")


class OptimizerError(ValueError):
    """An optimizer that cannot run here; the message says which to pick instead."""


@dataclass(frozen=True)
class Spec:
    """How an optimizer is built and what it keeps."""

    source: str  # "module.Class"; "bnb:Class" for bitsandbytes.optim.Class
    family: str = "plain"  # plain | adaptive (D-Adaptation, Prodigy) | schedule_free | adafactor
    state: tuple[int, int] = (2, 0)  # its state: (tensors the size of a weight, bytes per weight)
    defaults: dict[str, Any] = field(default_factory=dict)  # sd-scripts' defaults
    fallback: str = ""  # the optimizer to name when bitsandbytes cannot run

    @property
    def bnb(self) -> bool:
        return self.source.startswith("bnb:")


_NESTEROV = {"momentum": 0.9, "nesterov": True}  # sd-scripts sets momentum 0.9 when not given
OPTIMIZERS: dict[str, Spec] = {
    "AdamW": Spec("torch.optim.AdamW"),
    "AdamW8bit": Spec("bnb:AdamW8bit", state=(0, 2), fallback="AdamW"),
    "PagedAdamW8bit": Spec("bnb:PagedAdamW8bit", state=(0, 2), fallback="AdamW"),
    "PagedAdamW": Spec("bnb:PagedAdamW", state=(0, 8), fallback="AdamW"),
    "PagedAdamW32bit": Spec("bnb:PagedAdamW32bit", state=(0, 8), fallback="AdamW"),
    "Lion": Spec("lion_pytorch.Lion", state=(1, 0)),
    "Lion8bit": Spec("bnb:Lion8bit", state=(0, 1), fallback="Lion"),
    "PagedLion8bit": Spec("bnb:PagedLion8bit", state=(0, 1), fallback="Lion"),
    "SGDNesterov": Spec("torch.optim.SGD", state=(1, 0), defaults=_NESTEROV),
    "SGDNesterov8bit": Spec("bnb:SGD8bit", state=(0, 1), defaults=_NESTEROV,
                            fallback="SGDNesterov"),
    "Adafactor": Spec("transformers.optimization.Adafactor", "adafactor", (0, 0)),
    "Prodigy": Spec("prodigyopt.Prodigy", "adaptive", (4, 0)),
    "DAdaptAdam": Spec("dadaptation.DAdaptAdam", "adaptive", (3, 0)),
    "DAdaptation": Spec("dadaptation.experimental.DAdaptAdamPreprint", "adaptive", (3, 0)),
    "DAdaptAdamPreprint": Spec("dadaptation.experimental.DAdaptAdamPreprint", "adaptive",
                               (3, 0)),
    "DAdaptAdaGrad": Spec("dadaptation.DAdaptAdaGrad", "adaptive", (4, 0)),
    "DAdaptAdan": Spec("dadaptation.DAdaptAdan", "adaptive", (5, 0)),
    "DAdaptAdanIP": Spec("dadaptation.experimental.DAdaptAdanIP", "adaptive", (5, 0)),
    "DAdaptLion": Spec("dadaptation.DAdaptLion", "adaptive", (2, 0)),
    "DAdaptSGD": Spec("dadaptation.DAdaptSGD", "adaptive", (3, 0)),
    "AdamWScheduleFree": Spec("schedulefree.AdamWScheduleFree", "schedule_free", (2, 0)),
    "RAdamScheduleFree": Spec("schedulefree.RAdamScheduleFree", "schedule_free", (2, 0)),
    "SGDScheduleFree": Spec("schedulefree.SGDScheduleFree", "schedule_free", (1, 0)),
}
# Optimizers that step every parameter group with one rate: dadaptation / prodigyopt raise
# "different lr values in different parameter groups" at the first step otherwise.
ONE_LR = ("DAdaptAdam", "DAdaptation", "DAdaptAdamPreprint", "DAdaptLion", "DAdaptSGD",
          "Prodigy")
# The package each source comes from, for the message when it is missing.
PACKAGES = {"lion_pytorch": "lion-pytorch", "prodigyopt": "prodigyopt",
            "dadaptation": "dadaptation", "schedulefree": "schedulefree",
            "came_pytorch": "came-pytorch", "pytorch_optimizer": "pytorch-optimizer"}
# Schedules that need an entry of optimizer.lr_scheduler_args (the schedule's own keyword).
SCHEDULE_NEEDS = {"cosine_with_min_lr": ("min_lr_rate", "min_lr"),
                  "warmup_stable_decay": ("num_decay_steps",),
                  "piecewise_constant": ("step_rules",)}
DIFFUSERS_SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine",
                       "cosine_with_restarts", "polynomial", "piecewise_constant")


def spec(name: str) -> Spec:
    if name not in OPTIMIZERS:
        raise OptimizerError(f"optimizer.optimizer_type = {name!r}: unknown optimizer; one of "
                             f"{', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def relative_step(section: Any) -> bool:
    """Adafactor's own time-dependent step size (transformers' ``relative_step``). Unset, it is
    on with the ``adafactor`` schedule (as sd-scripts does) and off otherwise."""
    if section.optimizer_type != "Adafactor":
        return False
    return bool(section.optimizer_args.get("relative_step",
                                           section.lr_scheduler == "adafactor"))


def optimizer_problems(section: Any) -> Optional[str]:
    """Why the optimizer and the schedule cannot go together, or None (checked at load time)."""
    from trainer.optim.torch_schedulers import custom_scheduler_problem

    family, sched = spec(section.optimizer_type).family, section.lr_scheduler
    name = f"optimizer.optimizer_type = {section.optimizer_type!r}"
    if section.lr_warmup_steps and section.lr_warmup_ratio:
        return ("optimizer.lr_warmup_steps and optimizer.lr_warmup_ratio both set the warm-up; "
                "keep one")
    if section.lr_warmup_ratio and family == "schedule_free":
        return (f"{name} takes its warm-up in steps: set optimizer.lr_warmup_steps instead of "
                f"optimizer.lr_warmup_ratio")
    custom = custom_scheduler_problem(section)
    if custom:
        return custom
    if family == "schedule_free" and section.lr_scheduler_type:
        return f"{name} schedules its own steps: unset optimizer.lr_scheduler_type"
    if family == "schedule_free" and sched != "constant":
        return (f"{name} schedules its own steps: optimizer.lr_scheduler must be 'constant' "
                f"(not {sched!r}); optimizer.lr_warmup_steps becomes its warm-up")
    if family == "schedule_free" and section.lr_warmup_steps and \
            "warmup_steps" in section.optimizer_args:
        return (f"{name}: optimizer.lr_warmup_steps and optimizer.optimizer_args.warmup_steps "
                f"both set the warm-up; keep one")
    adafactor_args = section.optimizer_args if section.optimizer_type == "Adafactor" else {}
    if adafactor_args.get("warmup_init") and not relative_step(section):
        return (f"{name} with warmup_init needs relative_step: set optimizer.lr_scheduler = "
                f"'adafactor' (or optimizer_args.relative_step = true)")
    if sched == "adafactor" and not relative_step(section):
        return (f"optimizer.lr_scheduler = 'adafactor' reports Adafactor's relative step: it "
                f"needs optimizer.optimizer_type = 'Adafactor' with relative_step (here {name}"
                f"{', relative_step = false' if adafactor_args else ''})")
    if relative_step(section) and sched != "adafactor":
        return (f"{name} with relative_step computes its own step size: set "
                f"optimizer.lr_scheduler = 'adafactor' (not {sched!r}) or relative_step = false")
    if sched == "adafactor" and section.lr_warmup_steps:
        return ("optimizer.lr_scheduler = 'adafactor' has no warm-up of ours: unset "
                "optimizer.lr_warmup_steps (optimizer_args.warmup_init = true warms up)")
    needs = SCHEDULE_NEEDS.get(sched)
    if needs and not any(k in section.lr_scheduler_args for k in needs):
        return (f"optimizer.lr_scheduler = {sched!r} needs optimizer.lr_scheduler_args."
                f"{' or .'.join(needs)}, e.g. {_example(needs[0])}")
    return None


def _example(key: str) -> str:
    return {"min_lr_rate": "{min_lr_rate = 0.1}", "num_decay_steps": "{num_decay_steps = 100}",
            "step_rules": '{step_rules = "1:100,0.1"}'}.get(key, f"{{{key} = ...}}")


def make_optimizer(section: Any, groups: list[dict[str, Any]], backend: str):
    """The optimizer of ``section`` over the parameter ``groups`` (with per-group lr)."""
    name = section.optimizer_class or section.optimizer_type
    sp = Spec(name if "." in name else f"torch.optim.{name}") if section.optimizer_class \
        else spec(name)
    cls = _bitsandbytes(name, backend, sp) if sp.bnb else _import(name, sp.source)
    groups = [{k: v for k, v in g.items() if k != "name"} for g in groups]
    kwargs: dict[str, Any] = {"weight_decay": section.weight_decay, **sp.defaults}
    kwargs.update({k: tuple(v) if isinstance(v, list) else v  # betas = [0.9, 0.99]
                   for k, v in section.optimizer_args.items()})
    lr: Optional[float] = section.learning_rate
    if sp.family == "adafactor":
        kwargs.setdefault("relative_step", relative_step(section))
        if kwargs["relative_step"]:  # its step size is its own: no lr (as sd-scripts does)
            lr, groups = None, [{k: v for k, v in g.items() if k != "lr"} for g in groups]
        else:
            kwargs = {"scale_parameter": False, "warmup_init": False, **kwargs}
    if sp.family == "schedule_free" and section.lr_warmup_steps:
        kwargs.setdefault("warmup_steps", section.lr_warmup_steps)
    if name == "AdamW" and not section.optimizer_class:  # one fused kernel, not many small ops
        from trainer.system.speed import fused_adamw_kwargs

        kwargs.update(fused_adamw_kwargs([p for g in groups for p in g["params"]],
                                         section.optimizer_args))
    try:
        optimizer = cls(groups, lr=lr, **kwargs)
    except TypeError as exc:  # an argument this optimizer does not take
        raise OptimizerError(f"optimizer.optimizer_args for {name!r}: {exc}") from None
    if sp.family == "schedule_free":
        optimizer.train()  # it starts in eval mode; steps need train mode
    return optimizer


def _import(name: str, source: str):
    module, _, attr = source.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        package = PACKAGES.get(module.split(".")[0], module.split(".")[0])
        raise OptimizerError(f"optimizer.optimizer_type = {name!r} needs the {package} "
                             f"package ({exc}); run setup.sh or pip install {package}") from None
    except AttributeError:
        raise OptimizerError(f"optimizer.optimizer_class = {name!r}: {module} has no "
                             f"{attr}") from None


def _bitsandbytes(name: str, backend: str, sp: Spec):
    """bitsandbytes' class, imported only when an 8-bit or paged optimizer is chosen."""
    fallback = sp.fallback
    if backend not in BNB_BACKENDS:
        raise OptimizerError(
            f"optimizer.optimizer_type = {name!r}: bitsandbytes has no 8-bit or paged "
            f"optimizers for the {backend} device; use {fallback!r}"
        )
    from trainer.system.lazy_imports import (
        import_bitsandbytes,  # hidden from the libraries till now
    )

    try:
        bitsandbytes = import_bitsandbytes()
    except Exception as exc:  # noqa: BLE001 - a broken native library raises anything
        raise OptimizerError(
            f"optimizer.optimizer_type = {name!r}: bitsandbytes cannot be loaded ({exc}); "
            f"use {fallback!r} or reinstall with setup.sh"
        ) from None
    cls = getattr(bitsandbytes.optim, sp.source[4:], None)
    if cls is None:
        raise OptimizerError(f"optimizer.optimizer_type = {name!r}: bitsandbytes "
                             f"{bitsandbytes.__version__} has no {sp.source[4:]}; upgrade it "
                             f"(setup.sh) or use {fallback!r}")
    return cls


def make_scheduler(section: Any, optimizer, total_steps: int):
    """The learning-rate schedule: diffusers' and transformers' by name, transformers'
    AdafactorSchedule for ``adafactor`` (it reports Adafactor's own step size)."""
    name = section.lr_scheduler
    if section.lr_scheduler_type:
        from trainer.optim.torch_schedulers import make_custom_scheduler

        return make_custom_scheduler(section, optimizer)
    if name == "adafactor":
        from transformers.optimization import AdafactorSchedule

        return AdafactorSchedule(optimizer, initial_lr=section.learning_rate)
    args = dict(section.lr_scheduler_args)
    if name in DIFFUSERS_SCHEDULES:
        from diffusers.optimization import get_scheduler

        return get_scheduler(
            name, optimizer, num_warmup_steps=warmup_steps(section, total_steps),
            num_training_steps=total_steps, num_cycles=section.lr_scheduler_num_cycles,
            power=section.lr_scheduler_power, step_rules=args.get("step_rules"),
        )
    from transformers.optimization import get_scheduler as hf_scheduler

    return hf_scheduler(name, optimizer, num_warmup_steps=warmup_steps(section, total_steps),
                        num_training_steps=total_steps, scheduler_specific_kwargs=args)


def warmup_steps(section: Any, total_steps: int) -> int:
    """The warm-up in steps: lr_warmup_steps, or lr_warmup_ratio of the run's steps rounded
    down (sd-scripts: ``int(lr_warmup_steps * num_training_steps)`` for a float)."""
    if section.lr_warmup_ratio:
        return int(section.lr_warmup_ratio * total_steps)
    return section.lr_warmup_steps


def one_lr_problem(section: Any, rates: dict[str, float]) -> Optional[str]:
    """An optimizer of ``ONE_LR`` with different rates for the trained parts (``rates``: part
    -> its rate); None when it can run."""
    name = section.optimizer_class or section.optimizer_type
    if name not in ONE_LR or len(set(rates.values())) < 2:
        return None
    listed = ", ".join(f"{part} {lr:g}" for part, lr in rates.items())
    return (f"optimizer.optimizer_type = {name!r} steps every trained part with one learning "
            f"rate (it estimates the step size itself; dadaptation and prodigyopt stop at the "
            f"first step otherwise, in sd-scripts too): here {listed}. Set optimizer.unet_lr "
            f"and the text-encoder rates equal, or unset them")


def state_bytes_per_weight(name: str, weight_bytes: int) -> Optional[float]:
    """Bytes of optimizer state per trained weight kept in ``weight_bytes`` each; None for
    Adafactor, whose factored second moment depends on the shapes."""
    sp = spec(name)
    if sp.family == "adafactor":
        return None
    tensors, fixed = sp.state
    return tensors * weight_bytes + fixed
