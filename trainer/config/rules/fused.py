"""``optimizer.fused_backward_pass`` / ``optimizer.fused_optimizer_groups``: what they cannot go
with, refused when a config loads (the steps themselves: trainer/run/fused_steps.py).

What each refusal rests on (sd-scripts' sdxl_train.py and library/train_util.py assert the
first two):

- **Gradient accumulation.** The step runs as soon as a parameter's gradient is in, at every
  backward pass: with more than one micro-batch per step it would step on each of them.
- **Optimizers.** A hook steps a few parameters at a time, which is the same update as the whole
  step only for optimizers that update each tensor from its own gradient and state (AdamW, Lion,
  SGD, their 8-bit and paged kinds, Adafactor). D-Adaptation and Prodigy estimate one step size
  from every gradient at once, and the schedule-free ones count their steps per call.
  (sd-scripts allows Adafactor alone for fused_backward_pass, through its patched step_param.)
- **fp16's loss scaler** unscales the gradients and skips a step with infinities at
  ``optimizer.step()``, after the backward pass: the hooks would step on scaled gradients.
- **More than one process.** The gradients are averaged between processes after the backward
  pass, when the hooks have stepped already.
"""

from __future__ import annotations

from typing import Any

FUSED_FAMILIES = ("plain", "adafactor")  # trainer/optim/optimizers.py Spec.family


def problems(cfg: Any) -> list[str]:
    """Why a fused step cannot run, naming the setting."""
    from trainer.optim.optimizers import spec

    opt, tr = cfg.optimizer, cfg.training
    if not opt.fused_backward_pass and opt.fused_optimizer_groups is None:
        return []
    field = ("optimizer.fused_backward_pass" if opt.fused_backward_pass
             else "optimizer.fused_optimizer_groups")
    if opt.fused_backward_pass and opt.fused_optimizer_groups is not None:
        return ["optimizer.fused_backward_pass and optimizer.fused_optimizer_groups "
                "both fuse the step into the backward pass (one parameter at a time, "
                "or in groups); keep one"]
    if cfg.mode != "dreambooth":
        return [f"{field} is for DreamBooth, whose gradients are the size of the "
                f"model; in {cfg.mode} mode they are small: unset it"]
    if tr.gradient_accumulation_steps != 1:
        return [f"{field} steps the optimizer during each backward pass, so it needs "
                f"training.gradient_accumulation_steps = 1 (not "
                f"{tr.gradient_accumulation_steps}; sd-scripts asserts the same): "
                f"raise training.train_batch_size instead, or unset {field}"]
    name = opt.optimizer_class or opt.optimizer_type
    if opt.optimizer_class or spec(opt.optimizer_type).family not in FUSED_FAMILIES:
        return [f"{field} steps a few parameters at a time, which optimizer {name!r} "
                f"cannot (it takes its step size from every gradient at once, counts "
                f"its steps per call, or is not one this studio knows); set "
                f"optimizer.optimizer_type to AdamW, AdamW8bit, Lion, SGDNesterov or "
                f"Adafactor, or unset {field}"]
    if tr.mixed_precision == "fp16" or tr.full_fp16:
        return [f"{field} with training.mixed_precision = 'fp16': fp16's loss scaler "
                f"unscales the gradients after the backward pass, when the fused steps "
                f"are done; use 'bf16' (or 'no'), or unset {field}"]
    if tr.num_processes > 1 or tr.distributed == "fsdp":
        return [f"{field} with training.num_processes = {tr.num_processes}: the "
                f"gradients are averaged between processes after the backward pass, "
                f"when the fused steps are done; train on one process or unset "
                f"{field}"]
    return []
