"""Sample images during training, from the model being trained, through a diffusers pipeline.

:func:`inference_pipeline` builds the family's pipeline (StableDiffusionPipeline,
StableDiffusionXLPipeline, FluxPipeline or StableDiffusion3Pipeline) around the modules being
trained. The SD families sample with the sampler the config names on the training noise
schedule (so a zero-terminal-SNR run samples on the same schedule); the flow families with
their own flow-matching Euler scheduler; class-image generation uses it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from trainer.config import TrainConfig

SAMPLERS = {
    "ddim": "DDIMScheduler",
    "euler": "EulerDiscreteScheduler",
    "euler_a": "EulerAncestralDiscreteScheduler",
    "dpmsolver++": "DPMSolverMultistepScheduler",
}


def inference_pipeline(model: Any, cfg: TrainConfig, unet: Optional[Any] = None):
    """A pipeline over ``model``'s modules (``unet`` replaces the model's, e.g. unwrapped)."""
    import diffusers

    from trainer.models.conditioning import family_of

    family = family_of(model)
    config = dict(model.noise_scheduler.config)
    if family.objective == "flow":
        scheduler = model.noise_scheduler.__class__.from_config(config)
    else:
        if config.get("rescale_betas_zero_snr"):
            config["timestep_spacing"] = "trailing"  # Lin et al. 2024, section 3.3
        scheduler = getattr(diffusers, SAMPLERS[cfg.sampling.sample_sampler]).from_config(config)
    pipe = family.pipeline(model, unet if unet is not None else model.unet, scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_samples(model: Any, cfg: TrainConfig, step: int, accelerator: Any) -> list[Path]:
    """One image per prompt into ``<output_dir>/sample/``; returns their paths."""
    from trainer.models.conditioning import family_of

    sm = cfg.sampling
    parts = [model.vae] + [enc for _, enc, _ in family_of(model).text_encoders(model)]
    devices = [part.device for part in parts]  # cached text outputs may have moved encoders off
    for part in parts:
        part.to(accelerator.device)
    pipe = inference_pipeline(model, cfg, unet=accelerator.unwrap_model(model.unet))
    out_dir = Path(cfg.saving.output_dir) / "sample"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    unet_training = model.unet.training
    model.unet.eval()
    try:
        for i, prompt in enumerate(sm.sample_prompts):
            generator = torch.Generator("cpu").manual_seed(sm.sample_seed + i)
            with torch.no_grad(), accelerator.autocast():
                image = pipe(prompt, num_inference_steps=sm.sample_steps,
                             guidance_scale=sm.sample_guidance_scale,
                             height=cfg.dataset.resolution, width=cfg.dataset.resolution,
                             generator=generator).images[0]
            path = out_dir / f"{cfg.saving.output_name}_{step:06d}_{i:02d}.png"
            image.save(path)
            paths.append(path)
    finally:
        model.unet.train(unet_training)
        for part, device in zip(parts, devices):
            part.to(device)
    return paths
