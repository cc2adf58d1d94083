"""Prior preservation's class images: generate the missing ones with the base model.

With ``dataset.num_class_images = N`` the class folder in ``dataset.reg_data_dir`` must hold N
images. Before training, the missing ones are drawn by the base model (the prompt is
``dataset.class_prompt`` or the class folder's name; image i from seed ``training.seed + i``),
as diffusers' DreamBooth example does, and saved as ``class_<i>.png`` with a caption file, so
the next run finds them and generates nothing. Progress goes out as :class:`Progress` events,
and Stop is honoured between batches.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from trainer.config import TrainConfig
from trainer.data.discover import find_concept_folders
from trainer.data.images import is_image_file
from trainer.events import Progress

STAGE = "Generating class images"


class ClassImageError(ValueError):
    """Class images that cannot be generated; the message names the setting."""


def class_folder(cfg: TrainConfig) -> tuple[Path, str]:
    """The folder that receives the class images, and their prompt."""
    ds = cfg.dataset
    root = Path(ds.reg_data_dir).expanduser()
    folders = find_concept_folders(root, "dataset.reg_data_dir", lambda _: None) \
        if root.is_dir() else []
    if ds.class_prompt is None:
        if len(folders) == 1:
            return folders[0].path, folders[0].concept
        raise ClassImageError(
            f"dataset.class_prompt: set it (e.g. 'a photo of a dog'): dataset.reg_data_dir "
            f"({root}) has {len(folders)} N_class folders, so it does not say which class "
            f"to generate")
    for folder in folders:
        if folder.concept == ds.class_prompt:
            return folder.path, ds.class_prompt
    name = re.sub(r'[/\\:*?"<>|]+', "_", ds.class_prompt).strip() or "class"
    return root / f"1_{name}", ds.class_prompt


def missing_class_images(cfg: TrainConfig) -> tuple[Path, str, list[int]]:
    """(folder, prompt, indices of the ``class_<i>.png`` files to generate)."""
    wanted = cfg.dataset.num_class_images or 0
    folder, prompt = class_folder(cfg)
    images = [p for p in folder.iterdir() if is_image_file(p)] if folder.is_dir() else []
    taken = {p.stem for p in images}
    short = wanted - len(images)
    indices = [i for i in range(wanted + len(images)) if f"class_{i:05d}" not in taken]
    return folder, prompt, indices[:max(0, short)]


def ensure_class_images(cfg: TrainConfig, model: Any, info: Any, precision: str,
                        out: Any, batch_size: int = 1) -> int:
    """Generate the missing class images; returns how many were written.

    One image per pipeline call by default: batched maths rounds differently, and image i
    must come out the same however many others are generated with it."""
    from trainer.system.safe_write import atomic_path

    if cfg.dataset.num_class_images is None:
        return 0
    folder, prompt, todo = missing_class_images(cfg)
    if not todo:
        return 0
    out.log(f"{STAGE}: {len(todo)} of {cfg.dataset.num_class_images} into {folder} "
            f"(prompt {prompt!r})")
    from trainer.run.sampling import inference_pipeline

    pipe = inference_pipeline(model, cfg).to(info.torch_device)
    from trainer.config.sections.resolution import base_size

    sm, (width, height) = cfg.sampling, base_size(cfg.dataset.resolution)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    autocast = torch.autocast(info.torch_device.split(":")[0], dtype=dtype, enabled=dtype
                              is not None)
    for start in range(0, len(todo), batch_size):
        out.check_stop()
        chunk = todo[start:start + batch_size]
        gens = [torch.Generator("cpu").manual_seed(cfg.training.seed + i) for i in chunk]
        with torch.no_grad(), autocast:
            images = pipe([prompt] * len(chunk), num_inference_steps=sm.sample_steps,
                          guidance_scale=sm.sample_guidance_scale, height=height, width=width,
                          generator=gens).images
        for i, image in zip(chunk, images):
            stem = folder / f"class_{i:05d}"
            with atomic_path(stem.with_suffix(cfg.dataset.caption_extension)) as tmp:
                tmp.write_text(prompt + "\n", encoding="utf-8")
            with atomic_path(stem.with_suffix(".png")) as tmp:
                image.save(tmp, format="PNG")
        out.emit(Progress(STAGE, start + len(chunk), len(todo)))
    return len(todo)
