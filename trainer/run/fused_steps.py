"""``optimizer.fused_backward_pass`` and ``optimizer.fused_optimizer_groups``: the optimizer
steps during the backward pass, as sd-scripts' sdxl_train.py does (after PyTorch's tutorial
"How to save memory by fusing the optimizer step into the backward pass").

Each trained parameter gets a ``register_post_accumulate_grad_hook``. With fused_backward_pass
the hook steps that parameter as soon as its gradient is in and frees the gradient, so one
parameter's gradient is alive at a time instead of the whole model's (a full SDXL UNet's
gradients are 10 GB in fp32). With fused_optimizer_groups N, the parameters are cut into N
chunks as sd-scripts cuts them (ceil(count / N) each, a new one where the learning rate
changes), and a chunk is stepped when the last of its gradients is in.

sd-scripts builds one optimizer per chunk; here one optimizer keeps the state, the schedule
and the saved training state as in a normal run, and a hook steps it on its chunk alone (its
groups' ``params`` narrowed for that call). For the optimizers that trainer/config/rules/fused.py
lets through (each tensor updated from its own gradient and state) that is the same update as
the whole step. The loop's ``optimizer.step()`` steps what the hooks could not (a chunk with a
parameter that got no gradient, e.g. a text-encoder layer past clip_skip) and checks the
gradients were finite.

Clipping: the whole model's gradient norm is only known when the backward pass ends, so each
parameter's gradient is clipped to ``max_grad_norm`` on its own, as sd-scripts' hook does
(``accelerator.clip_grad_norm_(tensor, max_grad_norm)``); the loop's global clip is skipped.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from trainer.run.failures import NonFiniteError


class FusedUnavailable(ValueError):
    """A fused step that this run's device or launch cannot do; the message says why."""


def install(s: Any) -> None:
    """Put the fused steps in front of the session's optimizer when the config asks for them
    (the config's rules refused what they cannot go with; here what only the run knows)."""
    opt = s.cfg.optimizer
    if not opt.fused_backward_pass and opt.fused_optimizer_groups is None:
        return
    field = ("optimizer.fused_backward_pass" if opt.fused_backward_pass
             else "optimizer.fused_optimizer_groups")
    if s.accelerator.num_processes > 1:
        raise FusedUnavailable(f"{field} runs on one process: the gradients are averaged "
                               f"between processes after the backward pass, when the fused "
                               f"steps are done; train on one process or unset {field}")
    if s.precision == "fp16":
        raise FusedUnavailable(f"{field}: training.mixed_precision resolved to fp16 on this "
                               f"device, whose loss scaler unscales the gradients after the "
                               f"backward pass; set training.mixed_precision = 'bf16' or "
                               f"'no', or unset {field}")
    inner = getattr(s.optimizer, "optimizer", s.optimizer)
    count = None if opt.fused_backward_pass else opt.fused_optimizer_groups
    s.optimizer = FusedSteps(s.optimizer, chunks_of(inner.param_groups, count),
                             opt.max_grad_norm)


def chunks_of(groups: list[dict[str, Any]], count: Optional[int]) -> list[list[Any]]:
    """The trained parameters in stepping chunks: one each (``count`` None), or sd-scripts'
    split into ``count`` chunks, cut where the learning rate changes."""
    params = [(p, g["lr"]) for g in groups for p in g["params"] if p.requires_grad]
    size = 1 if count is None else math.ceil(len(params) / count)
    chunks: list[list[Any]] = []
    current: list[Any] = []
    last_lr = None
    for p, lr in params:
        if current and (lr != last_lr or len(current) == size):
            chunks.append(current)
            current = []
        current.append(p)
        last_lr = lr
    if current:
        chunks.append(current)
    return chunks


class FusedSteps:
    """The optimizer the loop sees: the steps happen in the hooks, ``step()`` finishes them."""

    clips_each_parameter = True  # the loop's global clip is skipped (trainer/run/loop.py)

    def __init__(self, optimizer: Any, chunks: list[list[Any]], max_norm: float):
        self.wrapped = optimizer  # accelerate's AcceleratedOptimizer (or the optimizer)
        self.inner = getattr(optimizer, "optimizer", optimizer)
        self.max_norm = max_norm
        self.chunks = chunks
        self.parts = [_by_group(chunk, self.inner.param_groups) for chunk in chunks]
        self.chunk_of = {p: i for i, chunk in enumerate(chunks) for p in chunk}
        self.pending = [len(chunk) for chunk in chunks]
        self.stepped = [False] * len(chunks)
        self.norm_sq: Optional[torch.Tensor] = None
        self.handles = [p.register_post_accumulate_grad_hook(self._hook)
                        for chunk in chunks for p in chunk]

    def __getattr__(self, name: str) -> Any:  # state_dict, param_groups, ... as the optimizer's
        return getattr(self.__dict__["wrapped"], name)

    def _hook(self, p: torch.Tensor) -> None:
        i = self.chunk_of[p]
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self._step_chunk(i)

    def _step_chunk(self, i: int) -> None:
        """Clip each gradient on its own, step the optimizer on chunk ``i`` only, free them."""
        with_grad = [p for p in self.chunks[i] if p.grad is not None]
        for p in with_grad:
            norm = (torch.nn.utils.clip_grad_norm_(p, self.max_norm) if self.max_norm > 0
                    else torch.linalg.vector_norm(p.grad)).float()
            self.norm_sq = norm.square() if self.norm_sq is None else self.norm_sq + norm.square()
        groups, kept = self.inner.param_groups, []
        try:
            for g, params in self.parts[i]:
                kept.append((g, g["params"]))
                g["params"] = params
            self.inner.param_groups = [g for g, _ in self.parts[i]]
            self.inner.step()
        finally:
            self.inner.param_groups = groups
            for g, params in kept:
                g["params"] = params
        for p in with_grad:
            p.grad = None
        self.stepped[i] = True

    def step(self, *args: Any, **kwargs: Any) -> None:
        """After the backward pass: step the chunks the hooks left (a parameter without a
        gradient this step), refuse non-finite gradients, and start the next step afresh."""
        for i, done in enumerate(self.stepped):
            if not done and any(p.grad is not None for p in self.chunks[i]):
                self._step_chunk(i)
        norm, self.norm_sq = self.norm_sq, None
        self.pending = [len(chunk) for chunk in self.chunks]
        self.stepped = [False] * len(self.chunks)
        if norm is not None and not math.isfinite(float(norm)):
            raise NonFiniteError(
                f"a gradient is not finite (norm {float(norm)}); "
                f"with the fused backward pass the parameters before it were stepped already, "
                f"so the run stops here and the last saved file is kept. Usual causes: a "
                f"learning rate too high (try a tenth), a broken image in the batch")

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.wrapped.zero_grad(set_to_none=set_to_none)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _by_group(chunk: list[Any], groups: list[dict]) -> list[tuple[dict, list[Any]]]:
    """The chunk's parameters under their optimizer groups, in the groups' order."""
    ids = {id(p) for p in chunk}
    parts = [(g, [p for p in g["params"] if id(p) in ids]) for g in groups]
    return [(g, params) for g, params in parts if params]
