"""Sample images during training, from the model being trained, through a diffusers pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.config import TrainConfig

SAMPLERS = {
    "ddim": "DDIMScheduler",
    "euler": "EulerDiscreteScheduler",
    "euler_a": "EulerAncestralDiscreteScheduler",
    "dpmsolver++": "DPMSolverMultistepScheduler",
}


def make_samples(model: Any, cfg: TrainConfig, step: int, accelerator: Any) -> list[Path]:
    """One image per prompt into ``<output_dir>/sample/``; returns their paths."""
    import diffusers
    from diffusers import StableDiffusionPipeline

    sm = cfg.sampling
    scheduler_cls = getattr(diffusers, SAMPLERS[sm.sample_sampler])
    vae_device = model.vae.device
    model.vae.to(accelerator.device)
    pipe = StableDiffusionPipeline(
        vae=model.vae, text_encoder=model.text_encoder, tokenizer=model.tokenizer,
        unet=accelerator.unwrap_model(model.unet),
        scheduler=scheduler_cls.from_config(model.noise_scheduler.config),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
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
        model.vae.to(vae_device)
    return paths
