"""kohya_ss keys that combine with others; each handler records every key it reads.

``DERIVED`` lists (the keys a handler owns, the handler), in the order they run; the extra
command-line flags run last, so a flag overrides the form's value as it does in sd-scripts.
The behaviour mirrored is kohya_ss's ``train_model`` (kohya_gui/lora_gui.py, dreambooth_gui.py):
"""

from __future__ import annotations

import math
from typing import Any

from trainer.config.plan import plan_steps
from trainer.importers.kohya import convert as c
from trainer.importers.kohya import flow, fused, keep_last, memory, rates, run_options
from trainer.importers.kohya.families import raw_on, role_value, switches
from trainer.importers.kohya.network import NETWORK_KEYS, network, optimizer
from trainer.importers.kohya.network_args import network_args
from trainer.importers.kohya.report import Ctx
from trainer.importers.kohya.table import (
    DIRECT,
    FAMILY_REASON,
    NOT_NEEDED,
    NOT_SUPPORTED,
    TRAINED,
    Rule,
    is_family_key,
    optimizer_target,
)

# the SD families' switches (``sdxl``, ``v2``...; their kohya roles), sorted as kohya_ss saves
SD_SWITCHES = switches("ddpm")
FAMILY_KEYS = (*sorted(k for keys in SD_SWITCHES.values() for k in keys), "v_parameterization")


def model_family(ctx: Ctx) -> None:
    """The SD families' switches (``sdxl``, the finetune tab's ``sdxl_checkbox``, ``v2``) pick
    the family; ``v_parameterization`` the v-prediction target. None on leaves model_version =
    auto (read from the model, which sd-scripts would take for SD 1.x)."""
    values = {}
    for key in FAMILY_KEYS:
        if key in ctx.data:
            try:
                values[key] = c.to_bool(ctx.data[key])
            except ValueError as exc:
                ctx.problems.append(f"{key} = {ctx.data[key]!r}: {exc}")
    deciding = {}  # the key that decides each family's switch: the first of its keys given
    for family, keys in SD_SWITCHES.items():
        given = [k for k in keys if k in values]
        if given:
            deciding[given[0]] = family
        for key in given[1:]:
            ctx.skip(key, f"a GUI switch; the {given[0]} key decides")
    on = sorted(k for k in deciding if values[k] is True)
    if len(on) > 1:
        ctx.problems.append(f"{' and '.join(on)} are both true: a model is one or the other")
        return
    for key in sorted(deciding):
        ctx.set(key, "model.model_version", deciding[key]) if values[key] is True else \
            ctx.unset(key)
    if "v_parameterization" in values:
        ctx.set("v_parameterization", "model.prediction_type", "v_prediction") \
            if values["v_parameterization"] is True else ctx.unset("v_parameterization")


def resolution(ctx: Ctx) -> None:
    raw = ctx.raw("max_resolution")
    if c.is_empty(raw):
        ctx.unset("max_resolution")
        return
    try:
        side, note = c.resolution(raw)
    except ValueError as exc:
        ctx.problems.append(f"max_resolution = {raw!r}: {exc}")
        return
    ctx.set("max_resolution", "dataset.resolution", side)
    if note:
        ctx.note("max_resolution", note)


def _positive(ctx: Ctx, key: str) -> float | None:
    value = ctx.num(key)
    return value if value and value > 0 else None


def total_steps(ctx: Ctx, steps: float | None, epochs: float | None) -> int | None:
    """The run's optimizer steps, for percentages of it: max_train_steps, or the epochs over
    the images x repeats in train_data_dir (when it can be read here), as trainer/config/plan.py
    counts them."""
    if steps:
        return int(steps)
    folder = ctx.raw("train_data_dir") or ctx.raw("image_folder")  # the finetune tab's name
    repeats = _positive(ctx, "dataset_repeats")
    count = c.kohya_image_count(str(folder or ""), ctx.raw("reg_data_dir"),
                                int(repeats) if repeats else None)
    if not count:
        return None
    batch = int(_positive(ctx, "train_batch_size") or 1)
    accum = int(_positive(ctx, "gradient_accumulation_steps") or 1)
    return plan_steps(-(-count // batch), accum, None, int(epochs or 1)).total_steps


def steps_and_epochs(ctx: Ctx) -> None:
    """sd-scripts: max_train_epochs overrides max_train_steps; kohya_ss computes the steps from
    ``epoch`` only when max_train_steps is 0 or empty."""
    epochs, steps, epoch = (_positive(ctx, k) for k in
                            ("max_train_epochs", "max_train_steps", "epoch"))
    chosen = ("max_train_epochs" if epochs else "max_train_steps" if steps else
              "epoch" if epoch else None)
    for key in ("max_train_epochs", "max_train_steps", "epoch"):
        if key not in ctx.data:
            continue
        if key == chosen:
            target = "training.max_train_steps" if key == "max_train_steps" else \
                "training.max_train_epochs"
            ctx.set(key, target, int(ctx.num(key) or 0))
        elif _positive(ctx, key):
            ctx.skip(key, f"{chosen} decides the length (as in kohya_ss / sd-scripts)")
        else:
            ctx.unset(key)
    run_epochs = epochs or (None if steps else epoch)
    total = total_steps(ctx, None if epochs else steps, run_epochs)
    warmup(ctx, total)
    stop_text_encoder(ctx, total)
    cycles(ctx, run_epochs)


def warmup(ctx: Ctx, total: int | None) -> None:
    """``lr_warmup`` is a percentage of the total steps; ``lr_warmup_steps`` (newer files)
    an absolute count that wins when set (kohya_ss common_gui.resolve_lr_warmup_steps)."""
    absolute, percent = _positive(ctx, "lr_warmup_steps"), _positive(ctx, "lr_warmup")
    if absolute:
        ctx.set("lr_warmup_steps", "optimizer.lr_warmup_steps", int(absolute))
        if percent:
            ctx.skip("lr_warmup", "lr_warmup_steps is set and wins (as in kohya_ss)")
    elif percent and total:
        ctx.set("lr_warmup", "optimizer.lr_warmup_steps", c.percent_of(percent, total))
        ctx.note("lr_warmup", f"{percent:g}% of {total} steps")
    elif percent:
        ctx.set("lr_warmup", "optimizer.lr_warmup_ratio", percent / 100)
        ctx.note("lr_warmup", f"{percent:g}% of steps that are unknown here (no max_train_steps, "
                              f"train_data_dir not on this machine): the run counts them")
    for key in ("lr_warmup_steps", "lr_warmup"):
        if key in ctx.data and not _positive(ctx, key):
            ctx.unset(key)


def stop_text_encoder(ctx: Ctx, total: int | None) -> None:
    """The form's "Stop TE (% of total steps)": -1 never trains the text encoder (sd-scripts
    train_db), 0 trains it to the end. kohya_ss's LoRA tab ignores it."""
    for key in ("stop_text_encoder_training", "stop_text_encoder_training_pct"):
        value = ctx.num(key) if key in ctx.data else None
        if key not in ctx.data or not value:
            ctx.unset(key) if key in ctx.data else None
        elif ctx.mode != "dreambooth":
            ctx.skip(key, f"kohya_ss uses it for DreamBooth only, not in {ctx.mode} mode")
        elif value < 0:
            ctx.set(key, "network.train_text_encoder", False)
        elif value >= 100:
            ctx.unset(key)
        elif total:
            ctx.set(key, "network.stop_text_encoder_training",
                    max(1, math.ceil(total / 100 * value)))
            ctx.note(key, f"{value:g}% of {total} steps")
        else:
            ctx.refuse(key, "a percentage of the total steps, which are unknown here: set "
                       "network.stop_text_encoder_training (steps)")


def cycles(ctx: Ctx, epochs: float | None) -> None:
    """kohya_ss passes the epoch count as the restarts when lr_scheduler_num_cycles is empty."""
    key = "lr_scheduler_num_cycles"
    if key not in ctx.data:
        return
    value = _positive(ctx, key)
    if value:
        ctx.set(key, "optimizer.lr_scheduler_num_cycles", int(value))
    elif ctx.raw("lr_scheduler") == "cosine_with_restarts" and epochs:
        ctx.set(key, "optimizer.lr_scheduler_num_cycles", int(epochs))
        ctx.note(key, f"empty: kohya_ss restarts once per epoch ({int(epochs)})")
    else:
        ctx.unset(key)


def learning_rates(ctx: Ctx) -> None:
    if ctx.mode == "lora":
        _lora_rates(ctx)
    elif ctx.mode == "dreambooth":
        _dreambooth_rates(ctx)
    for key in ("unet_lr", "text_encoder_lr", "learning_rate_te", "learning_rate_te1",
                "learning_rate_te2", "train_text_encoder"):
        if key in ctx.data and key not in ctx.report.keys():
            ctx.skip(key, f"not used by kohya_ss's {ctx.mode} training")


def _lora_rates(ctx: Ctx) -> None:
    """kohya_ss lora_gui.resolve_network_train_flags: a text-encoder LR of 0 with a UNet LR
    trains the UNet only, and the reverse the text encoder only; both 0 train both at
    learning_rate."""
    te, unet = _positive(ctx, "text_encoder_lr"), _positive(ctx, "unet_lr")
    for key, target, value in (("text_encoder_lr", "optimizer.text_encoder_lr", te),
                               ("unet_lr", "optimizer.unet_lr", unet)):
        if key in ctx.data:
            ctx.set(key, target, value) if value else ctx.unset(key)
    if "text_encoder_lr" in ctx.data or "unet_lr" in ctx.data:
        ctx.set("text_encoder_lr", "network.train_text_encoder", not (unet and not te))
        ctx.set("unet_lr", "network.train_unet", not (te and not unet))


def _present(ctx: Ctx, *keys: str) -> str:
    """The first of ``keys`` in the file: the key a derived value is reported under."""
    return next((k for k in keys if k in ctx.data), keys[0])


def _dreambooth_rates(ctx: Ctx) -> None:
    """sd-scripts train_db / sdxl_train train a text encoder unless its rate is 0 (an empty
    rate is learning_rate); the finetune tab adds a train_text_encoder switch and names SDXL
    sdxl_checkbox. SDXL has one rate per encoder (learning_rate_te1 / te2: its kohya role's
    TEXT_ENCODER_RATES)."""
    on = ctx.raw("train_text_encoder", True) not in (False, "false", "False")
    picked = [f for f, keys in SD_SWITCHES.items() if any(raw_on(ctx.raw(k)) for k in keys)]
    rates = next((r for r in (role_value(f, "TEXT_ENCODER_RATES") for f in picked) if r),
                 (("learning_rate_te", "network.train_text_encoder",
                   "optimizer.text_encoder_lr"),))
    for key, train, rate in rates:
        value = ctx.num(key) if key in ctx.data else None
        ctx.set(_present(ctx, key, "train_text_encoder"), train, on and value != 0)
        if value:
            ctx.set(key, rate, value)
    if "train_text_encoder" in ctx.data and "train_text_encoder" not in ctx.report.keys():
        ctx.set("train_text_encoder", "network.train_text_encoder",
                ctx.out["network"]["train_text_encoder"])


ADAPTIVE_WITHOUT_OFFSET = (
    "noise_offset is off: sd-scripts adds the adaptive scale to the noise offset only when "
    "there is one, and kohya_ss passed it only with noise_offset > 0 until April 2024, so it "
    "had no effect (today's kohya_ss passes it and sd-scripts stops: 'adaptive_noise_scale "
    "requires noise_offset')")


def noise(ctx: Ctx) -> None:
    """kohya_ss passes noise_offset / adaptive_noise_scale / noise_offset_random_strength for
    noise_offset_type "Original" and multires_noise_* for "Multires"."""
    kind = ctx.raw("noise_offset_type") or "Original"
    groups = {"Original": ("noise_offset", "adaptive_noise_scale",
                           "noise_offset_random_strength"),
              "Multires": ("multires_noise_iterations", "multires_noise_discount")}
    offset = _positive(ctx, "noise_offset") if kind == "Original" else None
    for group, keys in groups.items():
        for key in (k for k in keys if k in ctx.data):
            if group != kind:
                ctx.skip(key, f"noise_offset_type is {kind!r}: kohya_ss does not pass it")
            elif key == "noise_offset_random_strength":
                ctx.apply(key, Rule("training.noise_offset_random_strength", c.to_bool))
            elif key == "multires_noise_discount":
                if _positive(ctx, "multires_noise_iterations"):
                    ctx.apply(key, Rule("training.multires_noise_discount", c.to_float))
                else:
                    ctx.unset(key)
            elif key == "adaptive_noise_scale" and _positive(ctx, key) and not offset:
                ctx.skip(key, ADAPTIVE_WITHOUT_OFFSET)
            elif not ctx.num(key):
                ctx.unset(key)
            else:
                target = "training." + key
                ctx.apply(key, Rule(target, c.to_int if "iterations" in key else c.to_float))


def dataset_folders(ctx: Ctx) -> None:
    """With a dataset_config, sd-scripts reads the folders from it and kohya_ss ignores
    train_data_dir / reg_data_dir; masked_loss then takes its masks from that TOML."""
    toml = c.to_text(ctx.raw("dataset_config"))
    for key in ("dataset_config", "train_data_dir", "image_folder", "reg_data_dir"):
        if key not in ctx.data:
            continue
        if toml is not c.UNSET and key != "dataset_config" and not c.is_empty(ctx.raw(key)):
            ctx.skip(key, "dataset_config names the folders (kohya_ss ignores this key then)")
        else:
            ctx.apply(key, DIRECT[key])
    if "masked_loss" in ctx.data:
        if toml is not c.UNSET and c.to_bool(ctx.raw("masked_loss")) is True:
            ctx.set("masked_loss", "training.masked_loss", True)
        else:
            ctx.apply("masked_loss", DIRECT["masked_loss"])


def custom_scheduler(ctx: Ctx) -> None:
    """lr_scheduler_type names a torch scheduler class (optimizer.lr_scheduler_type, checked
    when the config loads); lr_scheduler_args are then its arguments, else the arguments of
    optimizer.lr_scheduler."""
    if "lr_scheduler_type" in ctx.data:
        ctx.apply("lr_scheduler_type", Rule("optimizer.lr_scheduler_type", c.to_text))
    if "lr_scheduler_args" in ctx.data:
        ctx.apply("lr_scheduler_args", DIRECT["lr_scheduler_args"])


FLAG_RULES: dict[str, Rule] = {
    "network_train_unet_only": Rule("network.train_text_encoder", lambda v: False, TRAINED),
    "network_train_text_encoder_only": Rule("network.train_unet", lambda v: False, TRAINED),
    "noise_offset": Rule("training.noise_offset", c.to_float),
    "adaptive_noise_scale": Rule("training.adaptive_noise_scale", c.to_float),
    "multires_noise_iterations": Rule("training.multires_noise_iterations", c.to_int),
    "multires_noise_discount": Rule("training.multires_noise_discount", c.to_float),
    "max_train_steps": Rule("training.max_train_steps", c.to_int),
    "max_train_epochs": Rule("training.max_train_epochs", c.to_int),
    "lr_warmup_steps": Rule("optimizer.lr_warmup_steps", c.to_int),
    "lr_warmup_ratio": Rule("optimizer.lr_warmup_ratio", c.to_float),  # --lr_warmup_steps < 1
    "optimizer_type": Rule("optimizer.optimizer_type", c.to_text),
    "optimizer_class": Rule("optimizer.optimizer_class",  # --optimizer_type a.B
                            lambda v: optimizer_target(v)[1]),
    "lr_scheduler_type": Rule("optimizer.lr_scheduler_type", c.to_text),
    "text_encoder_lr": Rule("optimizer.text_encoder_lr", c.to_float, TRAINED),
    "unet_lr": Rule("optimizer.unet_lr", c.to_float, TRAINED),
    "network_dim": Rule("network.network_dim", c.to_int, ("lora",)),
    "network_alpha": Rule("network.network_alpha", c.to_float, ("lora",)),
    "resolution": Rule("dataset.resolution", lambda v: c.resolution(v)[0]),
    "v_parameterization": Rule("model.prediction_type", lambda v: "v_prediction"),
    **keep_last.FLAG_RULES,  # --save_last_n_*: the schema checks their schedule
    "fp8_base": Rule("model.base_precision", lambda v: "fp8", ("lora",)),  # memory.py
    "block_lr": Rule("optimizer.block_lr", rates.block_rates, ("dreambooth",)),
    "resume_from_huggingface": Rule("saving.resume_from_huggingface", c.to_bool),
    "fused_backward_pass": Rule("optimizer.fused_backward_pass", lambda v: True,
                                ("dreambooth",)),
    "fused_optimizer_groups": Rule("optimizer.fused_optimizer_groups", c.to_int,
                                   ("dreambooth",)),
}


def flag_name(name: str, value: Any) -> str:
    """sd-scripts reads ``--lr_warmup_steps`` below 1 as a fraction of the steps and
    ``--optimizer_type module.Class`` as a class to import: our keys of their own."""
    if name == "lr_warmup_steps" and 0 < (c.number(value) or 0) < 1:
        return "lr_warmup_ratio"
    if name == "optimizer_type" and optimizer_target(value)[0].endswith("class"):
        return "optimizer_class"
    return name


def additional_parameters(ctx: Ctx) -> None:
    """The sd-scripts flags typed into "Additional parameters"; each is mapped like the form
    key of the same name, or reported."""
    key = "additional_parameters"
    try:
        flags = c.flags(ctx.raw(key))
    except ValueError as exc:
        ctx.problems.append(f"{key}: {exc}")
        return
    if not flags:
        ctx.unset(key)
    for name, value in flags:
        label = f"{key} --{name}"
        name = flag_name(name, value)
        rule = FLAG_RULES.get(name) or DIRECT.get(name)
        if rule is not None:
            ctx.apply(label, rule, value)
        elif name in NOT_NEEDED:
            ctx.skip(label, NOT_NEEDED[name])
        elif name in NOT_SUPPORTED:
            ctx.refuse(label, NOT_SUPPORTED[name], value)
        elif is_family_key(name):
            ctx.refuse(label, FAMILY_REASON, value)
        else:
            ctx.refuse(label, "an sd-scripts flag this importer does not map", value)


DERIVED: list[tuple[tuple[str, ...], Any]] = [
    (FAMILY_KEYS, model_family),
    (("max_resolution",), resolution),
    (("dataset_config", "train_data_dir", "image_folder", "reg_data_dir", "masked_loss"),
     dataset_folders),
    (("lr_scheduler_type", "lr_scheduler_args"), custom_scheduler),
    (("unet_lr", "text_encoder_lr", "learning_rate_te", "learning_rate_te1",
      "learning_rate_te2", "train_text_encoder"), learning_rates),
    (("epoch", "max_train_epochs", "max_train_steps", "lr_warmup", "lr_warmup_steps",
      "stop_text_encoder_training", "stop_text_encoder_training_pct",
      "lr_scheduler_num_cycles"), steps_and_epochs),
    (("noise_offset", "adaptive_noise_scale", "noise_offset_random_strength",
      "multires_noise_iterations", "multires_noise_discount"), noise),
    (NETWORK_KEYS, network),
    (("network_args",), network_args),  # a raw one: not from kohya_ss's LoRA tab
    (keep_last.KEYS, keep_last.keep_last),  # after save_every_n_* / save_state
    (("optimizer", "optimizer_args"), optimizer),
    (rates.CONTEXT_KEYS, rates.in_context),
    (rates.BLOCK_LR_KEYS, rates.block_lr),
    (run_options.HUB_RESUME_KEYS, run_options.hub_resume),
    (run_options.LAUNCH_KEYS, run_options.launch),
    (("additional_parameters",), additional_parameters),
    (fused.KEYS, fused.fused),  # after the flags (optimizer, accumulation)
    (run_options.CACHE_KEYS, run_options.latent_cache),  # after the flags
    (memory.KEYS, memory.memory),  # after the flags (gradient_checkpointing)
    (flow.KEYS, flow.flow),  # last: it drops the DDPM options mapped above
]
