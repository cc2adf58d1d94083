"""Load-time checks of the settings that came with kohya_ss parity (issue 21): each refuses a
combination that cannot work, naming the settings and what to change.

Called from :func:`trainer.config.rules.mode_checks`.
"""

from __future__ import annotations

from typing import Any

from trainer.optim.optimizers import ONE_LR  # noqa: F401 - the importer reads it here


def parity_checks(cfg: Any) -> None:
    from trainer.config.hub_rules import hub_resume_checks

    block_lr_checks(cfg)
    one_rate_checks(cfg)
    hub_resume_checks(cfg)
    caption_checks(cfg)
    color_aug_checks(cfg)
    full_fp16_checks(cfg)


def full_fp16_checks(cfg: Any) -> None:
    """sd-scripts asserts mixed_precision 'fp16' for --full_fp16; the device is checked when
    the run starts (trainer/run/full_fp16.py: GPUs only)."""
    tr = cfg.training
    if tr.full_fp16 and tr.full_bf16:
        raise ValueError("training.full_fp16 and training.full_bf16 both set the trained "
                         "weights' dtype; keep one")
    if tr.full_fp16 and tr.mixed_precision != "fp16":
        raise ValueError(f"training.full_fp16 needs training.mixed_precision = 'fp16' (not "
                         f"{tr.mixed_precision!r}): fp16 weights train under fp16's loss scaler")


def block_lr_checks(cfg: Any) -> None:
    """optimizer.block_lr is sdxl_train.py's (DreamBooth); it replaces the UNet's rate. The
    family is checked with the others (family_rules.family_problems: SDXL only)."""
    rates, opt = cfg.optimizer.block_lr, cfg.optimizer
    if rates is None:
        return
    if cfg.mode != "dreambooth":
        raise ValueError(f"optimizer.block_lr is the per-block rate of SDXL DreamBooth "
                         f"(sd-scripts' sdxl_train.py); mode {cfg.mode!r} does not read it"
                         + ("; a LoRA's block rates are network.down_lr_weight / "
                            "mid_lr_weight / up_lr_weight" if cfg.mode == "lora" else "")
                         + "; unset it")
    if not cfg.network.train_unet:
        raise ValueError("optimizer.block_lr sets the UNet's rates but network.train_unet is "
                         "off; unset one of them")
    if opt.unet_lr is not None:
        raise ValueError("optimizer.block_lr and optimizer.unet_lr both set the UNet's rate; "
                         "keep block_lr (one rate per block) or unset it")
    if not any(rates):
        raise ValueError("optimizer.block_lr is 0 for all 23 blocks: nothing of the UNet "
                         "would train; set network.train_unet = false instead")


def block_lr_family_problems(cfg: Any, family: str, name: str) -> list[str]:
    """optimizer.block_lr on a model of ``family`` (its ``name`` for the message)."""
    if cfg.optimizer.block_lr is None or family == "sdxl" or cfg.mode != "dreambooth":
        return []
    return [f"optimizer.block_lr counts the 23 blocks of SDXL's UNet (sd-scripts' "
            f"sdxl_train.py); {name} does not read it; unset it"]


def color_aug_checks(cfg: Any) -> None:
    """Cached latents hold each image's pixels once; sd-scripts asserts the two apart too."""
    if cfg.dataset.color_aug and cfg.dataset.cache_latents:
        raise ValueError("dataset.color_aug changes the pixels at every step, which "
                         "dataset.cache_latents would encode only once: turn "
                         "dataset.cache_latents off (sd-scripts refuses the two together)")


SD_CAPTION_KEYS = ("weighted_captions", "max_token_length", "no_token_padding")


def caption_checks(cfg: Any) -> None:
    """no_token_padding pads each batch to its own length, which 75-token windows and weights
    (trainer/families/sd/long_prompts.py) cannot follow; sd-scripts reads it in train_db.py only,
    without either."""
    ds = cfg.dataset
    if ds.no_token_padding and (ds.max_token_length or ds.weighted_captions):
        other = "max_token_length" if ds.max_token_length else "weighted_captions"
        raise ValueError(f"dataset.no_token_padding cannot go with dataset.{other}: the "
                         f"windows of 75 tokens and the weights need padded ids; keep one")


def caption_family_problems(cfg: Any, name: str) -> list[str]:
    """The SD families' caption settings on FLUX.1 / SD 3.5, whose prompts also go through T5
    (sd-scripts' FLUX.1 and SD3 trainers do not read them either)."""
    ds = cfg.dataset
    return [f"dataset.{key} is for SD 1.x / 2.x / SDXL's CLIP prompts; {name} does not read "
            f"it; unset it" for key in SD_CAPTION_KEYS if getattr(ds, key)]


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
    if cfg.model.model_version == "sdxl":
        second = net.train_text_encoder if net.train_text_encoder_2 is None \
            else net.train_text_encoder_2
        parts["second text encoder"] = (second, opt.text_encoder_2_lr or te)
    out = {part: lr for part, (on, lr) in parts.items() if on}
    if "unet" in out and cfg.mode == "dreambooth" and opt.block_lr is not None:
        del out["unet"]  # sdxl_train.py: one group per UNet block at its own rate
        out.update({f"UNet block {i}": lr for i, lr in enumerate(opt.block_lr) if lr})
    return out


def one_rate_checks(cfg: Any) -> None:
    """D-Adaptation and Prodigy step every group with one rate (trainer/optim/optimizers.py
    ONE_LR)."""
    from trainer.optim.optimizers import one_lr_problem

    problem = one_lr_problem(cfg.optimizer, trained_rates(cfg))
    if problem:
        raise ValueError(problem)
