"""kohya_ss's fused optimizer steps for SD 1.x / 2.x / SDXL: ``fused_backward_pass`` (the SDXL
parameters' checkbox, which kohya_ss saves in the DreamBooth and finetune tabs) and
``fused_optimizer_groups`` (0 is off) -> ``optimizer.`` keys of the same names
(trainer/run/fused_steps.py).

- sd-scripts fuses them in sdxl_train.py (and its FLUX.1 / SD3 trainers, whose keys are
  flow.py's); train_db.py and fine_tune.py parse ``--fused_backward_pass`` and only assert
  Adafactor and an accumulation of 1. Here the DreamBooth steps fuse for every family: the same
  weights, with one gradient alive at a time.
- The LoRA and textual-inversion trainers do not read either: "not needed" there.
- With both set, sdxl_train.py takes fused_backward_pass (its ``if`` comes first).
- A combination the config refuses (trainer/config/rules/fused.py: fp16's loss scaler, an
  accumulation above 1, an optimizer that needs every gradient at once) is "not supported",
  with the config's reason, and the rest of the file imports.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from trainer.config.rules.fused import problems as fused_problems
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.report import Ctx

KEYS = ("fused_backward_pass", "fused_optimizer_groups")
_NOT_READ = ("sd-scripts' {} trainer does not read it (its get_optimizer only asserts "
             "Adafactor with --fused_backward_pass); the fused steps are DreamBooth's here")


def fused(ctx: Ctx) -> None:
    """Both keys: mapped, off, not needed outside DreamBooth, or refused with the reason."""
    on = {}
    if "fused_backward_pass" in ctx.data and c.to_bool(ctx.raw("fused_backward_pass")) is True:
        on["fused_backward_pass"] = True
    groups = ctx.num("fused_optimizer_groups") if "fused_optimizer_groups" in ctx.data else None
    if groups and groups > 0:
        on["fused_optimizer_groups"] = int(groups)
    for key in KEYS:
        if key in ctx.data and key not in on:
            ctx.unset(key)
    if ctx.mode != "dreambooth":
        for key in on:
            ctx.skip(key, _NOT_READ.format("LoRA" if ctx.mode == "lora" else
                                           "textual-inversion"))
        return
    if len(on) == 2:
        ctx.skip("fused_optimizer_groups", "sdxl_train.py takes fused_backward_pass when both "
                                           "are set (kohya_ss's form allows one of them)")
        del on["fused_optimizer_groups"]
    for key, value in on.items():
        problem = _problem(ctx, key, value)
        if problem:
            ctx.refuse(key, problem)
        else:
            ctx.set(key, f"optimizer.{key}", value)


def _problem(ctx: Ctx, key: str, value: Any) -> str | None:
    """The config's refusal of this key with the rest of the import, or None."""
    def section(name: str) -> SimpleNamespace:
        prefix = f"{name}."
        values = {k[len(prefix):]: v for k, v in ctx.defaults.items() if k.startswith(prefix)}
        return SimpleNamespace(**{**values, **ctx.out.get(name, {})})

    optimizer = section("optimizer")
    optimizer.fused_backward_pass = key == "fused_backward_pass"
    optimizer.fused_optimizer_groups = value if key == "fused_optimizer_groups" else None
    problems = fused_problems(SimpleNamespace(mode=ctx.mode, optimizer=optimizer,
                                              training=section("training")))
    return problems[0] if problems else None
