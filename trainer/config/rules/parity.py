"""The rules of sd-scripts' training options that other settings rule out: SDXL DreamBooth's
per-block rates, one-rate optimizers, the Hub resume, caption padding, colour augmentation and
full fp16 weights; each refuses a combination that cannot work, naming the settings and what to
change.
"""

from __future__ import annotations

from typing import Any

from trainer.optim.optimizers import ONE_LR  # noqa: F401 - the importer reads it here


def problems(cfg: Any) -> list[str]:
    from trainer.config.rules.hub import problems as hub_problems

    for check in (block_lr_problems, one_rate_problems, hub_problems, caption_problems,
                  color_aug_problems, full_fp16_problems):
        found = check(cfg)
        if found:
            return found
    return []


def full_fp16_problems(cfg: Any) -> list[str]:
    """sd-scripts asserts mixed_precision 'fp16' for --full_fp16; the device is checked when
    the run starts (trainer/run/full_fp16.py: GPUs only)."""
    tr = cfg.training
    if tr.full_fp16 and tr.full_bf16:
        return ["training.full_fp16 and training.full_bf16 both set the trained weights' dtype; "
                "keep one"]
    if tr.full_fp16 and tr.mixed_precision != "fp16":
        return [f"training.full_fp16 needs training.mixed_precision = 'fp16' (not "
                f"{tr.mixed_precision!r}): fp16 weights train under fp16's loss scaler"]
    return []


def block_lr_problems(cfg: Any) -> list[str]:
    """optimizer.block_lr is sdxl_train.py's (DreamBooth); it replaces the UNet's rate. The
    family is its ``families`` hint's (trainer/config/rules/family.py)."""
    rates, opt = cfg.optimizer.block_lr, cfg.optimizer
    if rates is None:
        return []
    if cfg.mode != "dreambooth":
        return [f"optimizer.block_lr is the per-block rate of SDXL DreamBooth (sd-scripts' "
                f"sdxl_train.py); mode {cfg.mode!r} does not read it"
                + ("; a LoRA's block rates are network.down_lr_weight / mid_lr_weight / "
                   "up_lr_weight" if cfg.mode == "lora" else "")
                + "; unset it"]
    if not cfg.network.train_unet:
        return ["optimizer.block_lr sets the UNet's rates but network.train_unet is off; unset "
                "one of them"]
    if opt.unet_lr is not None:
        return ["optimizer.block_lr and optimizer.unet_lr both set the UNet's rate; keep "
                "block_lr (one rate per block) or unset it"]
    if not any(rates):
        return ["optimizer.block_lr is 0 for all 23 blocks: nothing of the UNet would train; "
                "set network.train_unet = false instead"]
    return []


def color_aug_problems(cfg: Any) -> list[str]:
    """Cached latents hold each image's pixels once; sd-scripts asserts the two apart too."""
    if cfg.dataset.color_aug and cfg.dataset.cache_latents:
        return ["dataset.color_aug changes the pixels at every step, which dataset.cache_latents "
                "would encode only once: turn dataset.cache_latents off (sd-scripts refuses the "
                "two together)"]
    return []


def caption_problems(cfg: Any) -> list[str]:
    """no_token_padding pads each batch to its own length, which 75-token windows and weights
    (trainer/families/sd/long_prompts.py) cannot follow; sd-scripts reads it in train_db.py only,
    without either."""
    ds = cfg.dataset
    if ds.no_token_padding and (ds.max_token_length or ds.weighted_captions):
        other = "max_token_length" if ds.max_token_length else "weighted_captions"
        return [f"dataset.no_token_padding cannot go with dataset.{other}: the windows of 75 "
                f"tokens and the weights need padded ids; keep one"]
    return []


def _reads(family: str, key: str) -> bool:
    """Whether ``family`` reads the setting ``key`` (its ``families`` hint)."""
    from trainer.config.rules.family import hinted

    return all(family in families for s, n, _, families in hinted() if f"{s}.{n}" == key)


def trained_rates(cfg: Any) -> dict[str, float]:
    """The learning rate of each part that trains (LoRA and DreamBooth), as the run groups
    them: the UNet at unet_lr, the text encoders at text_encoder_lr / text_encoder_2_lr, each
    falling back to learning_rate (the second encoder to the first's rate)."""
    opt, net = cfg.optimizer, cfg.network
    if cfg.mode == "textual_inversion":
        return {}
    te = opt.text_encoder_lr or opt.learning_rate
    parts = {"unet": (net.train_unet, opt.unet_lr or opt.learning_rate),
             "text encoder": (net.train_text_encoder, te)}
    from trainer.families import version_family

    version = version_family(cfg.model.model_version)
    if version != "auto" and _reads(version, "optimizer.text_encoder_2_lr"):
        second = net.train_text_encoder if net.train_text_encoder_2 is None \
            else net.train_text_encoder_2
        parts["second text encoder"] = (second, opt.text_encoder_2_lr or te)
    out = {part: lr for part, (on, lr) in parts.items() if on}
    if "unet" in out and cfg.mode == "dreambooth" and opt.block_lr is not None:
        del out["unet"]  # sdxl_train.py: one group per UNet block at its own rate
        out.update({f"UNet block {i}": lr for i, lr in enumerate(opt.block_lr) if lr})
    return out


def one_rate_problems(cfg: Any) -> list[str]:
    """D-Adaptation and Prodigy step every group with one rate (trainer/optim/optimizers.py
    ONE_LR)."""
    from trainer.optim.optimizers import one_lr_problem

    problem = one_lr_problem(cfg.optimizer, trained_rates(cfg))
    return [problem] if problem else []
