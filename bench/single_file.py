"""Training from a full-size SD 1.5-architecture single file, offline: time to the first step and
peak memory.

    python bench/single_file.py [--steps 6] [--keep DIR] [--precision no]
    python bench/single_file.py --keep DIR --build-only sdxl   # the file only, for single_file_load

Builds the model from the studio's own SD 1.x configs (trainer/assets/families/sd1) with random
weights and writes it as an fp16 original-layout .safetensors file, the form users have (about
2 GB; the build takes a minute and ~5 GB of memory, in a process of its own). Then, in a fresh
process with HF_HUB_OFFLINE=1, trains a LoRA for a few steps at 64 px from that file: the
loading path a user's checkpoint takes. The tokenizer is the embedded tiny one (a real CLIP
tokenizer cannot be downloaded here); it is given through model.tokenizer.

Prints: load-to-first-step seconds, steps/s after the first step, and the peak RSS. The weights
are 1.07 G parameters, 4.0 GiB in fp32: a peak near that plus the training state means one copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from childproc import ROOT, StepTimes, peak_rss_mib, run_child

FILE_NAMES = {"sd1": "sd15-random.safetensors", "sdxl": "sdxl-random.safetensors"}


def _build(folder: str, family: str = "sd1") -> dict:
    """Runs in a child: the random SD 1.5-size (or SDXL-size) model as a single file, and a
    tokenizer. SDXL-size modules are built in fp16 so that the build fits in 24 GB."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from trainer.families.sd.checkpoint import save_checkpoint
    from trainer.families.sd.tiny import write_tokenizer_files

    configs = ROOT / "trainer" / "assets" / "families" / family
    torch.manual_seed(0)
    if family == "sdxl":
        torch.set_default_dtype(torch.float16)
    unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(configs / "unet"))
    vae = AutoencoderKL.from_config(AutoencoderKL.load_config(configs / "vae"))
    te = CLIPTextModel(CLIPTextConfig.from_pretrained(configs / "text_encoder"))
    extra = {}
    if family == "sdxl":
        extra["text_encoder_2"] = CLIPTextModelWithProjection(
            CLIPTextConfig.from_pretrained(configs / "text_encoder_2"))
    path = Path(folder) / FILE_NAMES[family]
    save_checkpoint(path, unet, vae, te, family=family, dtype=torch.float16, **extra)
    write_tokenizer_files(Path(folder) / "tokenizer")
    params = sum(p.numel() for m in (unet, vae, te, *extra.values()) for p in m.parameters())
    return {"path": str(path), "bytes": path.stat().st_size, "params": params}


def _train(path: str, tokenizer: str, out: str, steps: int, precision: str = "auto") -> dict:
    """Runs in a child: LoRA steps from the single file, timed."""
    sys.path.insert(0, str(ROOT))
    from trainer.config.files import from_dict
    from trainer.run.loop import run

    sink = StepTimes()
    cfg = from_dict({
        "model": {"pretrained_model_name_or_path": path, "tokenizer": tokenizer},
        "dataset": {"resolution": 64, "min_bucket_reso": 64, "max_bucket_reso": 128,
                    "bucket_reso_steps": 64},
        "training": {"max_train_steps": steps, "log_with": "none",
                     "mixed_precision": precision},
        "saving": {"output_dir": out},
    })
    start = time.perf_counter()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return {"first_step_s": sink.times[0] - start, "steps_per_s": sink.rate(1),
            "peak_rss_mib": peak_rss_mib()}


def _child(name: str, args: list) -> dict:
    return run_child(__file__, [name, *args], HF_HUB_OFFLINE="1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--keep", help="a folder for the model (reused when it is there)")
    parser.add_argument("--precision", default="auto",
                        help="training.mixed_precision ('no': fp32 modules; 'auto' on a CPU with "
                             "bf16 units probes bf16 with a bf16 copy of the UNet first)")
    parser.add_argument("--child")
    parser.add_argument("--build-only", choices=sorted(FILE_NAMES),
                        help="only write that family's file into --keep (for "
                             "bench/single_file_load.py); sdxl is 6.9 GB")
    args = parser.parse_args()
    if args.child:
        name, *rest = json.loads(args.child)
        print(json.dumps({"build": _build, "train": _train}[name](*rest)))
        return
    os.environ["KOHYA_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    folder = Path(args.keep or tempfile.mkdtemp(prefix="bench-sd15-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.build_only:
        built = _child("build", [str(folder), args.build_only])
        print(f"built {built['path']}: {built['bytes'] / 2**30:.2f} GiB fp16, "
              f"{built['params'] / 1e9:.3f} G parameters")
        return
    model = folder / "sd15-random.safetensors"
    if not model.is_file():
        built = _child("build", [str(folder)])
        print(f"built {built['path']}: {built['bytes'] / 2**30:.2f} GiB fp16, "
              f"{built['params'] / 1e9:.3f} G parameters")
    r = _child("train", [str(model), str(folder / "tokenizer"),
                         tempfile.mkdtemp(prefix="bench-out-"), args.steps, args.precision])
    print(f"SD 1.5-size single file, LoRA at 64 px, {os.cpu_count()} cores, offline: "
          f"{r['first_step_s']:.1f} s from run() to the first step, "
          f"{r['steps_per_s']:.2f} steps/s after it, peak RSS {r['peak_rss_mib'] / 1024:.2f} GiB")


if __name__ == "__main__":
    main()
