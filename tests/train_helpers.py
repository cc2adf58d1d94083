"""Small builders shared by the training tests: configs on tiny data, and a fixed evaluation."""

import hashlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from trainer.config.files import from_dict, load
from trainer.config.paths import PROJECT_ROOT

DEFAULT_PRESET = PROJECT_ROOT / "presets" / "lora" / "default.toml"


def one_image_dataset(root: Path, size=(64, 64), caption="a red circle") -> Path:
    """A kohya folder with a single image and its caption."""
    folder = root / "1_circle"
    folder.mkdir(parents=True)
    img = Image.new("RGB", size, (30, 60, 200))
    ImageDraw.Draw(img).ellipse((8, 8, size[0] - 8, size[1] - 8), fill=(220, 30, 30))
    img.save(folder / "circle.png")
    (folder / "circle.txt").write_text(caption)
    return root


def preset_config(tmp_path: Path, mode: str = "lora", **sections):
    """The default preset with its output in tmp_path and the given section overrides."""
    cfg = load(DEFAULT_PRESET).model_dump(mode="json", exclude_none=True)
    cfg["mode"] = mode
    cfg["saving"]["output_dir"] = str(tmp_path / "out")
    cfg["training"]["log_with"] = "none"
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return from_dict(cfg)


def small_config(tmp_path: Path, data_dir: Path, mode: str = "lora", **sections):
    """A quick config (LoRA unless ``mode`` says otherwise) on a one-image dataset at 64 px."""
    base = {"dataset": {"train_data_dir": str(data_dir), "resolution": 64,
                        "min_bucket_reso": 64, "max_bucket_reso": 128,
                        "bucket_reso_steps": 64},
            "training": {"max_train_steps": 3, "max_train_epochs": None, "train_batch_size": 1},
            "saving": {"save_precision": "fp32"}}
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return preset_config(tmp_path, mode, **base)


@torch.no_grad()
def eval_loss(pipe, image_path: Path, caption: str, size: int = 64) -> float:
    """Denoising loss of a pipeline's UNet on one image, at fixed noise and timesteps."""
    img = Image.open(image_path).convert("RGB").resize((size, size))
    px = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1).permute(2, 0, 1)[None]
    latents = pipe.vae.encode(px).latent_dist.mode() * pipe.vae.config.scaling_factor
    gen = torch.Generator().manual_seed(1234)
    timesteps = torch.tensor([50, 150, 300, 450, 600, 750, 900])
    latents = latents.repeat(len(timesteps), 1, 1, 1)
    noise = torch.randn(latents.shape, generator=gen)
    ids = pipe.tokenizer([caption] * len(timesteps), padding="max_length", max_length=77,
                         return_tensors="pt").input_ids
    hidden = pipe.text_encoder(ids)[0]
    noisy = pipe.scheduler.add_noise(latents, noise, timesteps)
    pred = pipe.unet(noisy, timesteps, hidden).sample
    return torch.nn.functional.mse_loss(pred, noise).item()


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn at random (norms included), so that two same-shaped tensors swapped
    by mistake cannot pass a test as equal."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return module.eval()


def folder_digest(path: Path) -> str:
    """sha256 over a folder's relative file names and contents: equal for identical trees."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()
