"""An exponential moving average of the trained weights (``training.ema_decay``).

sd-scripts has none; OneTrainer and SimpleTuner keep one, with diffusers' ``EMAModel``
(diffusers.training_utils), which this wraps: after every optimizer step each shadow weight
moves towards the trained one, ``shadow -= (1 - decay) x (shadow - weight)``. With the warm-up
(``training.ema_warmup``, EMAModel's ``use_ema_warmup`` with inv_gamma 1 and power 2/3) the
decay at update n is ``min(ema_decay, 1 - n^(-2/3))`` (0 at the first: the average starts at the
first trained weights), so the initial weights do not dominate; without it the decay is
``ema_decay`` from the first update. Saves and samples use the average while
``saving.use_ema_weights`` is on (:meth:`Ema.applied` swaps it in and back); the training state
keeps the shadow weights and the step count, so a resumed run averages exactly as one that never
stopped.

The loop calls ``s.ema.update()`` after every optimizer step whatever the config: without an
EMA it is :class:`NoEma`, which does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import torch

FILE = "ema.pt"  # in the training state folder


class NoEma:
    """No EMA kept: every call is a no-op."""

    active = False

    def update(self) -> None:
        pass

    @contextmanager
    def applied(self) -> Iterator[None]:
        yield

    def state_dict(self) -> Optional[dict[str, Any]]:
        return None

    def save(self, folder: Path, state: Optional[dict[str, Any]] = None) -> None:
        pass

    def load(self, folder: Path) -> None:
        pass


class Ema(NoEma):
    """The EMA of ``params`` (the optimizer's parameters)."""

    active = True

    def __init__(self, params: list[torch.nn.Parameter], decay: float, warmup: bool,
                 for_outputs: bool):
        from diffusers.training_utils import EMAModel

        self.params, self.for_outputs = params, for_outputs
        self.model = EMAModel(params, decay=decay, use_ema_warmup=warmup, inv_gamma=1.0,
                              power=2 / 3)
        if not warmup:  # EMAModel's own ramp (1 + n) / (10 + n) would still apply: a constant
            self.model.get_decay = lambda optimization_step: decay

    def update(self) -> None:
        self.model.step(self.params)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The EMA weights in the trained parameters for the duration (when the config says
        saves and samples use them), the trained ones back after."""
        if not self.for_outputs:
            yield
            return
        # EMAModel.store / restore, on a DTensor's local rows with FSDP (trainer/run/fsdp.py)
        stored = [_local(p).detach().cpu().clone() for p in self.params]
        self.model.copy_to(self.params)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, saved in zip(self.params, stored):
                    _local(p).copy_(saved)

    def state_dict(self) -> Optional[dict[str, Any]]:
        return self.model.state_dict()

    def save(self, folder: Path, state: Optional[dict[str, Any]] = None) -> None:
        """Write ``state`` (by default this process's :meth:`state_dict`; FSDP's gathered)."""
        torch.save(self.model.state_dict() if state is None else state, folder / FILE)

    def load(self, folder: Path) -> None:
        """The shadow weights and step count of a saved state (its config had the same EMA)."""
        from trainer.run.state import StateError

        path = folder / FILE
        if not path.is_file():
            raise StateError(f"training.resume: {folder} has no {FILE}, though "
                             f"training.ema_decay is set; it was saved by another run")
        state = torch.load(path, weights_only=True)
        self.model.load_state_dict(state)
        from trainer.run.fsdp import like  # FSDP: each shadow sharded as its weight

        self.model.shadow_params = [like(shadow, p) for shadow, p in
                                    zip(self.model.shadow_params, self.params)]


def _local(p: torch.Tensor) -> torch.Tensor:
    """A plain tensor itself; a DTensor's rows on this process."""
    return p.to_local() if hasattr(p, "to_local") else p


def make_ema(cfg: Any, params: list[torch.nn.Parameter]) -> NoEma:
    """The run's EMA: :class:`Ema` with ``training.ema_decay`` set, else :class:`NoEma`."""
    tr = cfg.training
    decay: Optional[float] = tr.ema_decay
    if decay is None:
        return NoEma()
    return Ema(params, decay, tr.ema_warmup, cfg.saving.use_ema_weights)
