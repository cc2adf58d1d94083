"""kohya_ss's learning rates that sd-scripts reads in context: ``learning_rate`` beside the
group rates, ``lr_scheduler_power`` beside the schedule, the one rate of D-Adaptation and Prodigy,
and the finetune tab's ``block_lr`` (SDXL). Each handler records every key it owns; it runs after
the learning rates and the optimizer are mapped (derived.DERIVED).
"""

from __future__ import annotations

from typing import Any

from trainer.config.rules.parity import ONE_LR
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.families import role_value, switches
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import DIRECT

CONTEXT_KEYS = ("learning_rate", "lr_scheduler_power")


def in_context(ctx: Ctx) -> None:
    """``learning_rate`` (0 when the group rates are all set) and ``lr_scheduler_power`` (read
    by the polynomial schedule only), then D-Adaptation's and Prodigy's one rate."""
    opt = ctx.out.get("optimizer", {})
    if "learning_rate" in ctx.data:
        lr = ctx.num("learning_rate")
        if not lr and _group_rates_cover(ctx, opt):
            ctx.skip("learning_rate", "0, and unet_lr / text_encoder_lr set the rate of every "
                                      "part that trains (sd-scripts uses learning_rate only "
                                      "for a part without one)")
        else:
            ctx.apply("learning_rate", DIRECT["learning_rate"])
    if "lr_scheduler_power" in ctx.data:
        custom = "lr_scheduler_type" in opt
        if ctx.raw("lr_scheduler", "constant") == "polynomial" and not custom:
            ctx.apply("lr_scheduler_power", DIRECT["lr_scheduler_power"])
        elif c.is_empty(ctx.raw("lr_scheduler_power")):
            ctx.unset("lr_scheduler_power")
        else:
            ctx.skip("lr_scheduler_power", "only the polynomial schedule reads it (sd-scripts "
                                           f"passes it to {ctx.raw('lr_scheduler')!r} unused)")
    one_rate(ctx, ctx.out.get("optimizer", {}))


def _group_rates_cover(ctx: Ctx, opt: dict[str, Any]) -> bool:
    """Every part that trains has a rate of its own (derived._lora_rates has set them)."""
    if ctx.mode != "lora":
        return False
    net = ctx.out.get("network", {})
    unet = "unet_lr" in opt or net.get("train_unet") is False
    te = "text_encoder_lr" in opt or net.get("train_text_encoder") is False
    return unet and te


def one_rate(ctx: Ctx, opt: dict[str, Any]) -> None:
    """D-Adaptation and Prodigy step every group at one rate: dadaptation and prodigyopt stop
    at the first step when the rates differ (in sd-scripts too, after its warning that only the
    first group's rate counts). The import keeps that first rate for every group, as the
    warning says: sd-scripts' LoRA lists the text encoder's parameters first."""
    name = opt.get("optimizer_type")
    te, unet = opt.get("text_encoder_lr"), opt.get("unet_lr")
    trains_te = ctx.out.get("network", {}).get("train_text_encoder", True)
    if name not in ONE_LR or te is None or unet is None or te == unet or not trains_te:
        return
    first = te
    ctx.set("unet_lr", "optimizer.unet_lr", first)
    ctx.note("unet_lr", f"{name} steps every part at one rate (sd-scripts warns that only the "
                        f"first group's, the text encoder's {first:g}, takes effect): the UNet "
                        f"trains at {first:g}, not {unet:g}")


BLOCK_LR_KEYS = ("block_lr",)


def block_lr(ctx: Ctx) -> None:
    """The finetune tab's "Block LR (SDXL)": kohya_ss writes it into every finetune config, and
    only sdxl_train.py reads it (23 comma-separated rates, asserted there)."""
    text = ctx.raw("block_lr")
    if c.is_empty(text):
        ctx.unset("block_lr")
        return
    sdxl = any(c.to_bool(ctx.raw(k, False)) is True for f, keys in switches("ddpm").items()
               if role_value(f, "BLOCK_LR") for k in keys)
    if ctx.mode != "dreambooth":
        ctx.skip("block_lr", f"sd-scripts reads it in sdxl_train.py (SDXL DreamBooth and "
                             f"fine-tuning) only, not in {ctx.mode} mode")
        return
    if not sdxl:
        ctx.skip("block_lr", "sd-scripts reads it in sdxl_train.py only; without sdxl, "
                             "kohya_ss runs fine_tune.py / train_db.py, which do not")
        return
    try:
        ctx.set("block_lr", "optimizer.block_lr", block_rates(text))
    except ValueError as exc:
        ctx.problems.append(f"block_lr = {text!r}: {exc}")


def block_rates(text: Any) -> list[float]:
    """sdxl_train.py's ``--block_lr`` text: 23 comma-separated rates (asserted there)."""
    try:
        rates = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise ValueError("23 comma-separated learning rates, one per UNet block") from None
    if len(rates) != 23:
        raise ValueError(f"{len(rates)} values; sdxl_train.py needs 23, one per UNet block")
    return rates
