"""kohya_ss keys of issue 21's remainder: colour augmentation, fp16 weights, the trackers and
the Hub upload. Their one-to-one rules (``RUN_DIRECT``, merged into kohya_table.DIRECT, so the
same flags in ``additional_parameters`` map too) and the one handler that reads two keys:
``color_aug`` with the latent cache, which sd-scripts refuses together (the pixels change at
every step); the import keeps the augmentation and turns the cache off, with a note.
"""

from __future__ import annotations

from typing import Any

from trainer.importers import kohya_convert as c

# kohya key -> (our dotted key, converter)
RUN_DIRECT: dict[str, tuple[str, Any]] = {
    "color_aug": ("dataset.color_aug", c.to_bool),
    "full_fp16": ("training.full_fp16", c.to_bool),
    "log_tracker_name": ("training.log_tracker_name", c.to_text),
    "wandb_run_name": ("training.wandb_run_name", c.to_text),
    "log_tracker_config": ("training.log_tracker_config", c.to_text),
    # the Hub upload (trainer/run/hub.py); the token stays out of the config (kohya_table)
    "huggingface_repo_id": ("saving.huggingface_repo_id", c.to_text),
    "huggingface_repo_type": ("saving.huggingface_repo_type",
                              c.choice({"model": "model", "dataset": "dataset"})),
    "huggingface_path_in_repo": ("saving.huggingface_path_in_repo", c.to_text),
    "huggingface_repo_visibility": ("saving.huggingface_repo_visibility",
                                    lambda value: visibility(value)),
    "save_state_to_huggingface": ("saving.save_state_to_huggingface", c.to_bool),
    "async_upload": ("saving.async_upload", c.to_bool),
}


def visibility(value: Any) -> Any:
    """sd-scripts makes the repository private unless the visibility is 'public'."""
    return c.UNSET if c.is_empty(value) else ("public" if value == "public" else "private")

CACHE_KEYS = ("cache_latents",)  # DERIVED: after additional_parameters, which may set either


def latent_cache(ctx: Any) -> None:
    """``cache_latents`` as the form says (a ``--cache_latents`` flag has set it already), then
    off when colour augmentation is on. ``ctx``: kohya_report.Ctx (which imports
    kohya_table, which imports this module)."""
    value = c.to_bool(ctx.raw("cache_latents"))
    if "dataset.cache_latents" in ctx.targets:
        ctx.skip("cache_latents", "additional_parameters sets it")
    elif value is c.UNSET:
        ctx.unset("cache_latents")
    else:
        ctx.set("cache_latents", "dataset.cache_latents", value)
    ds = ctx.out.get("dataset", {})
    if ds.get("color_aug") and ds.get("cache_latents", True):
        ds["cache_latents"] = ds["cache_latents_to_disk"] = False
        ctx.note("cache_latents", "off: color_aug changes the pixels at every step, which a "
                                  "latent cache would encode once (sd-scripts refuses the two "
                                  "together)")


HUB_RESUME_KEYS = ("resume_from_huggingface",)  # DERIVED: with resume (a DIRECT key)


def hub_resume(ctx: Any) -> None:
    """sd-scripts reads resume_from_huggingface only with --resume (which then names the Hub
    state): the form's switch with an empty resume is not needed."""
    key = "resume_from_huggingface"
    on = c.to_bool(ctx.raw(key))
    if on is not True:
        ctx.unset(key)
    elif c.is_empty(ctx.raw("resume")):
        ctx.skip(key, "sd-scripts reads it only with resume (the state on the Hub), which the "
                      "file leaves empty")
    else:
        ctx.set(key, "saving.resume_from_huggingface", True)
