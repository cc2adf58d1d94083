"""GPU check: the trainer's precision paths on a real GPU, and the speed of a full-size SD 1.5.

    python bench/gpu_check.py [--smoke] [--out DIR]

1. The tiny model trained with mixed precision auto, fp16, full_bf16 + AdamW8bit and a
   text-encoder LoRA with Lion8bit: each must finish with a finite loss, and its file must load
   in diffusers and generate a finite image on the device.
2. A LoRA on an SD 1.5-sized model (random weights: 860M-parameter UNet, CLIP-L-sized text
   encoder, full VAE) at 512 px, batch 1 and 4, bf16, latent cache on: steps/s and peak device
   memory. ``--smoke`` runs part 1 with a few steps only (for a CPU check before a GPU run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _dataset(root: Path, size: int, n: int = 8) -> Path:
    from PIL import Image, ImageDraw

    folder = root / "10_shapes"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        w, h = (size, size) if i % 2 == 0 else (size, size * 3 // 2)
        img = Image.new("RGB", (w, h), (20 * i, 80, 200 - 20 * i))
        ImageDraw.Draw(img).ellipse((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=(230, 40, 40))
        img.save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a red circle, number {i}")
    return root


def _run(cfg_dict: dict) -> dict:
    from trainer.config.files import from_dict
    from trainer.events import ListSink, Step
    from trainer.run.loop import run

    sink = ListSink()
    start = time.time()
    result = run(from_dict(cfg_dict), sink)
    steps = sink.of(Step)
    return {"status": result.status, "error": result.error, "output": result.output_path,
            "steps": len(steps), "seconds": round(time.time() - start, 1),
            "last_loss": steps[-1].loss if steps else None,
            "it_per_s": round(steps[-1].it_per_s, 2) if steps else None}


def _generate(model_dir: str, lora: str, device: str) -> bool:
    import torch
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True).to(device)
    pipe.load_lora_weights(lora)
    pipe.set_progress_bar_config(disable=True)
    img = pipe("a red circle", num_inference_steps=4, height=64, width=64,
               output_type="pt").images
    return bool(torch.isfinite(img).all())


def precision_paths(work: Path, steps: int) -> list[dict]:
    from trainer.models.loader import resolve_model_path
    from trainer.system.device import detect

    info = detect()
    data = _dataset(work / "tiny-data", 128)
    cases = {
        "auto": {"training": {"mixed_precision": "auto"}},
        "fp16": {"training": {"mixed_precision": "fp16"}},
        "full_bf16+AdamW8bit": {"training": {"mixed_precision": "bf16", "full_bf16": True},
                                "optimizer": {"optimizer_type": "AdamW8bit"}},
        "te-lora fp16 Lion8bit": {"training": {"mixed_precision": "fp16"},
                                  "network": {"train_text_encoder": True},
                                  "optimizer": {"optimizer_type": "Lion8bit",
                                                "learning_rate": 1e-4}},
    }
    if info.backend == "cpu":  # CPU smoke: the CPU does no fp16
        cases = {k: v for k, v in cases.items() if "fp16" not in k}
    model_dir = str(resolve_model_path("embedded:tiny-sd15"))
    out = []
    for name, extra in cases.items():
        cfg = {"dataset": {"train_data_dir": str(data), "resolution": 128,
                           "min_bucket_reso": 64, "max_bucket_reso": 256},
               "training": {"max_train_steps": steps, "train_batch_size": 2, "log_with": "none"},
               "saving": {"output_dir": str(work / name.replace(" ", "_"))}}
        for section, values in extra.items():
            cfg.setdefault(section, {}).update(values)
        r = _run(cfg)
        r["case"] = name
        if r["status"] == "finished":
            r["finite_loss"] = math.isfinite(r["last_loss"])
            r["diffusers_image_finite"] = _generate(model_dir, r["output"], info.torch_device)
        out.append(r)
        print(json.dumps(r), flush=True)
    return out


def build_sd15_sized(path: Path) -> Path:
    import torch
    from diffusers import (
        AutoencoderKL,
        DDPMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from trainer.families.sd.tiny import build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, sample_size=512)
    te = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tok), hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=77, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    sched = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                          clip_sample=False)
    StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched,
                            safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(path)
    print(f"SD 1.5-sized model: UNet {sum(p.numel() for p in unet.parameters()) / 1e6:.0f}M "
          f"parameters", flush=True)
    return path


def sd15_speed(work: Path, steps: int) -> list[dict]:
    import torch

    model = build_sd15_sized(work / "sd15-sized")
    data = _dataset(work / "sd15-data", 512)
    out = []
    for batch in (1, 4):
        torch.cuda.reset_peak_memory_stats()
        cfg = {"model": {"pretrained_model_name_or_path": str(model)},
               "dataset": {"train_data_dir": str(data), "resolution": 512},
               "network": {"network_dim": 32, "network_alpha": 16.0},
               "training": {"max_train_steps": steps, "train_batch_size": batch,
                            "log_with": "none", "mixed_precision": "bf16"},
               "saving": {"output_dir": str(work / f"sd15-b{batch}")}}
        r = _run(cfg)
        r.update(case=f"sd15-sized 512px batch {batch} bf16",
                 peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
        out.append(r)
        print(json.dumps(r), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    os.environ.setdefault("KOHYA_STUDIO_HOME", str(work / "home"))
    from trainer.tools import doctor

    doctor.main([])
    results = precision_paths(work, 4 if args.smoke else 40)
    if not args.smoke:
        results += sd15_speed(work, 30)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gpu_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
