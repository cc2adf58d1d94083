"""Combinations of settings that cannot work, refused when a config is loaded, with the reason.

Each module of this package is the rules of one concept and exposes ``problems(cfg) ->
list[str]``: every message names the settings and what to change. :func:`check` runs them in
the order of ``RULES`` and raises the first problem (:class:`trainer.config.TrainConfig`'s
validator calls it). :mod:`~trainer.config.rules.family` is also called by the run once a
model given by path is read (its family is known only then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _optimizer(cfg: Any) -> list[str]:
    """An optimizer and a schedule that cannot pair (trainer/optim/optimizers.py)."""
    from trainer.optim.optimizers import optimizer_problems

    problem = optimizer_problems(cfg.optimizer)
    return [problem] if problem else []


def rules() -> tuple[Callable[[Any], list[str]], ...]:
    """The rule modules' ``problems``, in the order they are checked."""
    from trainer.config.rules import (
        distributed,
        family,
        fused,
        loss,
        memory,
        modes,
        network,
        parity,
    )

    return (modes.dataset_config_problems, network.problems, family.problems, memory.problems,
            distributed.problems, modes.problems, loss.problems, parity.problems,
            fused.problems, _optimizer)


def problems(cfg: Any) -> list[str]:
    """The problems of the first rule that finds any (a later rule may assume the earlier
    ones hold)."""
    for rule in rules():
        found = rule(cfg)
        if found:
            return found
    return []


def check(cfg: Any) -> None:
    """Raise ValueError with the first problem of ``cfg``."""
    found = problems(cfg)
    if found:
        raise ValueError(found[0])
