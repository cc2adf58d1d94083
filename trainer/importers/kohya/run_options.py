"""kohya_ss's options of the run around the training step: colour augmentation, fp16 weights, the
trackers, the Hub upload and the processes. Their one-to-one rules (``RUN_DIRECT``, merged into
table.DIRECT, so the same flags in ``additional_parameters`` map too) and the handlers that read
two keys: ``color_aug`` with the latent cache, which sd-scripts refuses together (the pixels
change at every step; the import keeps the augmentation and turns the cache off, with a note),
and accelerate's ``num_processes`` with ``multi_gpu``, which decides whether it counts.
"""

from __future__ import annotations

from typing import Any

from trainer.importers.kohya import convert as c

# kohya key -> (our dotted key, converter)
RUN_DIRECT: dict[str, tuple[str, Any]] = {
    "color_aug": ("dataset.color_aug", c.to_bool),
    "full_fp16": ("training.full_fp16", c.to_bool),
    "log_tracker_name": ("training.log_tracker_name", c.to_text),
    "wandb_run_name": ("training.wandb_run_name", c.to_text),
    "log_tracker_config": ("training.log_tracker_config", c.to_text),
    # the Hub upload (trainer/run/hub.py); the token stays out of the config (table)
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
    off when colour augmentation is on. ``ctx``: report.Ctx (which imports
    table, which imports this module)."""
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


LAUNCH_KEYS = ("num_processes", "multi_gpu")


def launch(ctx: Any) -> None:
    """kohya_ss passes ``--num_processes N`` to ``accelerate launch`` always and ``--multi_gpu``
    only when its box is ticked. Without it (and without an accelerate config file) accelerate
    starts one process, unless it finds more than one GPU (kohya_ss's
    class_accelerate_launch.py, accelerate's ``_validate_launch_command``): so the processes
    count here only with ``multi_gpu``, and accelerate refuses ``multi_gpu`` with one."""
    count = ctx.num("num_processes")
    multi = c.to_bool(ctx.raw("multi_gpu")) is True
    if count is not None and count != int(count):
        ctx.problems.append(f"num_processes = {ctx.raw('num_processes')!r}: not a whole number")
        return
    if "multi_gpu" in ctx.data:
        ctx.skip("multi_gpu", "decides whether num_processes counts (it does when true)"
                 if multi else "off: one process trains, whatever num_processes says")
    if count is None:
        if "num_processes" in ctx.data:
            ctx.unset("num_processes")
    elif multi and count >= 2:
        ctx.set("num_processes", "training.num_processes", int(count))
    elif multi:
        ctx.skip("num_processes", f"{int(count)} with multi_gpu: accelerate refuses "
                 "multi_gpu with fewer than 2 processes; one process trains here")
    elif count > 1:
        ctx.skip("num_processes", f"{int(count)} without multi_gpu: accelerate then starts one "
                 "process unless it sees more than one GPU; set training.num_processes to "
                 "train on several GPUs")
    else:
        ctx.set("num_processes", "training.num_processes", int(count))
