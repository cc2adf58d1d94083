"""Sample images during training, from the model being trained, through a diffusers pipeline.

:func:`inference_pipeline` builds the family's pipeline (StableDiffusionPipeline,
StableDiffusionXLPipeline, FluxPipeline or StableDiffusion3Pipeline) around the modules being
trained. The SD families sample with the sampler the config names on the training noise
schedule (so a zero-terminal-SNR run samples on the same schedule); the flow families with
their own flow-matching Euler scheduler; class-image generation uses it too. A family may draw
a prompt through another pipeline of its own (``sample_pipeline``: Qwen-Image-Edit's edit
pipelines for a prompt with a control image).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from trainer.config import TrainConfig
from trainer.run.sample_prompts import sample_prompts


def _sd_scheduler_config(model: Any) -> dict[str, Any]:
    config = dict(model.noise_scheduler.config)
    if config.get("rescale_betas_zero_snr"):
        config["timestep_spacing"] = "trailing"  # Lin et al. 2024, section 3.3
    return config


def inference_pipeline(model: Any, cfg: TrainConfig, unet: Optional[Any] = None):
    """A pipeline over ``model``'s modules (``unet`` replaces the model's, e.g. unwrapped)."""
    from trainer.families import family_of
    from trainer.run.sample_prompts import make_scheduler
    from trainer.system.library_lock import library_imports

    family = family_of(model)
    with library_imports():  # trainer/system/library_lock.py
        if family.objective == "flow":
            scheduler = model.noise_scheduler.__class__.from_config(
                model.noise_scheduler.config)
        else:
            scheduler = make_scheduler(cfg.sampling.sample_sampler, _sd_scheduler_config(model))
        pipe = family.pipeline(model, unet if unet is not None else model.denoiser, scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_samples(model: Any, cfg: TrainConfig, step: int, accelerator: Any) -> list[Path]:
    """One image per prompt into ``<output_dir>/sample/``, each with its own options
    (trainer/run/sample_prompts.py); returns their paths."""
    from trainer.families import family_of

    family = family_of(model)
    parts = [model.vae] + [enc for _, enc, _ in family.text_encoders(model)]
    devices = [part.device for part in parts]  # cached text outputs may have moved encoders off
    for part in parts:
        part.to(accelerator.device)
    pipe = inference_pipeline(model, cfg, unet=accelerator.unwrap_model(model.denoiser))
    out_dir = Path(cfg.saving.output_dir) / "sample"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    unet_training = model.denoiser.training
    model.denoiser.eval()
    try:
        for i, spec in enumerate(sample_prompts(cfg)):
            drawer, args = _drawer(model, pipe, _call_args(model, cfg, pipe, spec, i))
            with torch.no_grad(), accelerator.autocast():
                image = drawer(**args).images[0]
            path = out_dir / f"{cfg.saving.output_name}_{step:06d}_{i:02d}.png"
            if accelerator.is_main_process:  # FSDP: every process samples, rank 0 writes
                image.save(path)
            paths.append(path)
    finally:
        model.denoiser.train(unet_training)
        for part, device in zip(parts, devices):
            part.to(device)
    return paths


def _call_args(model: Any, cfg: TrainConfig, pipe: Any, spec: Any, i: int) -> dict[str, Any]:
    """The pipeline's arguments for one prompt: its own options over the [sampling] section;
    an SD family's sampler is set on ``pipe`` (a prompt's --ss)."""
    from trainer.config.sections.resolution import base_size
    from trainer.families import family_of
    from trainer.run.sample_prompts import make_scheduler, side

    sm, (width, height) = cfg.sampling, base_size(cfg.dataset.resolution)
    if family_of(model).objective != "flow":
        pipe.scheduler = make_scheduler(spec.sampler or sm.sample_sampler,
                                        _sd_scheduler_config(model))
    seed = spec.seed if spec.seed is not None else sm.sample_seed + i
    args = {"prompt": spec.prompt, "num_inference_steps": spec.steps or sm.sample_steps,
            "guidance_scale": sm.sample_guidance_scale if spec.scale is None else spec.scale,
            "height": side(spec.height, height), "width": side(spec.width, width),
            "generator": torch.Generator("cpu").manual_seed(seed)}
    if spec.negative_prompt:
        args["negative_prompt"] = spec.negative_prompt
    args.update(_control_args(model, spec))
    own = getattr(family_of(model), "sample_arguments", None)  # its pipeline's own names
    return own(args) if own is not None else args


def _drawer(model: Any, pipe: Any, args: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The pipeline that draws a prompt with ``args``: ``pipe``, unless the family picks
    another for them (its ``sample_pipeline``: Qwen-Image-Edit's edit pipelines for a prompt
    with a control, which its text-to-image pipeline cannot read)."""
    from trainer.families import family_of

    own = getattr(family_of(model), "sample_pipeline", None)
    return own(model, pipe, args) if own is not None else (pipe, args)


def _control_args(model: Any, spec: Any) -> dict[str, Any]:
    """An edit model's references of a prompt (``--ci``), as its pipeline's ``image``: one
    image, or a list for a family that takes several; none for a family that takes none (an
    option it does not read, ignored as sd-scripts ignores those)."""
    from PIL import Image

    from trainer.families import spec as family_spec

    most = family_spec(model.version).controls.max
    if not spec.control_images or most == 0:
        return {}
    images = []
    for path in spec.control_images[:most]:
        try:
            with Image.open(Path(path).expanduser()) as img:
                images.append(img.convert("RGB"))
        except OSError as exc:
            raise ValueError(f"sample prompt {spec.prompt!r}: --ci {path}: cannot read the "
                             f"control image ({exc}); fix the path in sampling.sample_prompts "
                             f"or the prompt file") from None
    return {"image": images[0] if most == 1 else images}
