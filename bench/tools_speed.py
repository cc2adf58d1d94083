"""Time of the LoRA tools on an SD 1.5-size model with random weights, built here from configs.

    python bench/tools_speed.py [--rank 64] [--threads N] [--extract] [--keep DIR]

Builds SD 1.5's UNet (860M parameters), VAE and CLIP ViT-L text encoder from their published
configs with fixed seeds as a diffusers folder (fp32), and a random kohya LoRA of the given rank
on every layer this studio's LoRA trains (UNet transformer blocks and text encoder), then times,
each in a fresh process (so that its peak RSS is its own):

- merge: the LoRA into the model, saved as one fp16 checkpoint in the original layout;
- resize: the LoRA to rank/4, and dynamically (sv_fro 0.9);
- extract (with ``--extract``): a rank-32 LoRA from the merged checkpoint and the base.

The tokenizer is the embedded tiny one (the tools never tokenize); nothing is downloaded.
About 5 GB of disk and 8 GB of memory at the peak. ``--keep DIR`` keeps (and reuses) the model
and the LoRA. ``--threads N`` sets torch's threads in the timed processes: on a small shared
CPU, one thread can beat the default (MKL's threads wait for busy cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childproc import parse_or_run_child

ROOT = Path(__file__).resolve().parent.parent

SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
SD15_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, sample_size=512, layers_per_block=2,
    block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, scaling_factor=0.18215)
SD15_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                 num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                 hidden_act="quick_gelu", projection_dim=768)


def build_model(folder: str) -> dict:
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
    unet = UNet2DConditionModel(**SD15_UNET)
    torch.manual_seed(1)
    vae = AutoencoderKL(**SD15_VAE)
    torch.manual_seed(2)
    text_encoder = CLIPTextModel(CLIPTextConfig(**SD15_TEXT))
    scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              num_train_timesteps=1000, clip_sample=False, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder,
                                   tokenizer=build_tokenizer(), unet=unet, scheduler=scheduler,
                                   safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(folder, safe_serialization=True)
    count = sum(p.numel() for p in unet.parameters())
    return {"unet_parameters": count}


def build_lora(folder: str, path: str, rank: int) -> dict:
    """A random LoRA over the studio's LoRA targets, shapes from the model's configs (meta)."""
    from types import SimpleNamespace

    import torch
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from trainer.methods.lora import TEXT_ENCODER_TARGETS, UNET_TARGETS
    from trainer.system.safe_write import save_safetensors_atomic
    from trainer.tools.targets import matches, model_targets

    with torch.device("meta"):
        model = SimpleNamespace(
            unet=UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(
                folder, subfolder="unet")),
            text_encoder=CLIPTextModel(CLIPTextConfig(**SD15_TEXT)), version="sd1")
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for target, _ in model_targets(model):
        targets = UNET_TARGETS if target.part == "unet" else TEXT_ENCODER_TARGETS
        if not matches(target.path, targets):
            continue
        shape = target.module.weight.shape
        tail = (1, 1) if len(shape) == 4 else ()
        tensors[f"{target.name}.lora_down.weight"] = (
            torch.randn(rank, shape[1], *tail, generator=gen) / shape[1] ** 0.5).half()
        tensors[f"{target.name}.lora_up.weight"] = (
            torch.randn(shape[0], rank, *tail, generator=gen) * 0.01).half()
        tensors[f"{target.name}.alpha"] = torch.tensor(rank / 2).half()
    meta = {"ss_network_module": "networks.lora", "ss_network_dim": str(rank),
            "ss_network_alpha": str(rank / 2), "ss_base_model_version": "sd_v1"}
    save_safetensors_atomic(path, tensors, meta)
    return {"modules": len(tensors) // 3, "lora_mib": os.path.getsize(path) / 2**20}


def run_case(case: str, work: str, rank: int, threads: int) -> dict:
    """Runs in the child process."""
    import torch

    sys.path.insert(0, str(ROOT))
    if threads:
        torch.set_num_threads(threads)
    folder, lora = f"{work}/sd15", f"{work}/lora.safetensors"
    started = time.perf_counter()
    if case == "build":
        result = build_model(folder)
        result.update(build_lora(folder, lora, rank))
    elif case == "merge":
        from trainer.tools.merge import merge
        from trainer.tools.options import MergeOptions

        report = merge(MergeOptions(base=folder, loras=[lora],
                                    save_to=f"{work}/merged.safetensors"))
        result = {f"{k}_s": v for k, v in report.seconds.items()}
    elif case.startswith("resize"):
        from trainer.tools.options import ResizeOptions
        from trainer.tools.resize import resize

        dynamic = {"dynamic_method": "sv_fro", "dynamic_param": 0.9} if case.endswith(
            "fro") else {}
        report = resize(ResizeOptions(path=lora, save_to=f"{work}/{case}.safetensors",
                                      rank=rank // 4 if not dynamic else rank, **dynamic))
        ranks = sorted(m.new_rank for m in report.modules)
        result = {"modules": len(ranks), "new_rank_median": ranks[len(ranks) // 2],
                  "fro_kept_mean": report.mean_fro_kept}
    else:  # extract
        from trainer.tools.extract import extract
        from trainer.tools.options import ExtractOptions

        report = extract(ExtractOptions(base=folder, tuned=f"{work}/merged.safetensors",
                                        save_to=f"{work}/extracted.safetensors", rank=32,
                                        config_dir=folder))
        result = {"modules": len(report.modules)}
    result["total_s"] = time.perf_counter() - started
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


def child(case: str, work: str, rank: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps([case, work, rank, threads])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--extract", action="store_true", help="time extract too (slow)")
    parser.add_argument("--keep", help="work in this folder and keep it")
    args = parse_or_run_child(parser, run_case)
    work = args.keep or tempfile.mkdtemp(prefix="bench-tools-")
    Path(work).mkdir(parents=True, exist_ok=True)
    print(f"SD 1.5-size random model, LoRA rank {args.rank}, {os.cpu_count()} cores, "
          f"torch threads {args.threads or 'default'}; work folder {work}")
    built = (Path(work) / "sd15" / "model_index.json").is_file() and (
        Path(work) / "lora.safetensors").is_file()
    cases = ([] if built else ["build"]) + ["merge", "resize", "resize-fro"] + (
        ["extract"] if args.extract else [])
    try:
        for case in cases:
            result = child(case, work, args.rank, args.threads)
            figures = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                for k, v in result.items())
            print(f"{case:<11} {figures}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
