"""FLUX.1 and SD 3.5 LoRA speed and memory on this machine (issue 18).

    python bench/flow_speed.py [--tiny-only] [--sd35-steps 2] [--size 256]

1. The two tiny presets as shipped (presets/lora/tiny-flux.toml, tiny-sd3.toml: the embedded
   models at 64 px, batch 2, 60 steps) through the real run, sampling off so that the steps
   are timed alone: steps/s after a warm-up, the whole run's wall time, peak RSS, and the
   precision the run chose.
2. One SD 3.5 medium-size LoRA step at ``--size`` px (default 256), in bf16 and in fp32: the
   transformer built from trainer/assets/families/sd35-medium (2.2 G parameters) with random
   weights (fixed seed; counted on the meta device first, so a case that would not fit in
   memory is skipped with the reason, not swapped), LoRA on sd-scripts' SD3 modules at the
   sd35-large-16gb preset's rank 16 / alpha 1, AdamW, the step through the run's own
   ``batch_loss`` (trainer/run/step.py: the objective, the family's denoiser call, the loss).
   As the SD 3.5 presets do, latents and text-encoder outputs are cached (T5's 256 tokens +
   CLIP's 77, random here), so the VAE and the text encoders (T5-XXL: 4.7 G parameters) are
   not loaded: the figure is the step the loop repeats. bf16 is the run's
   ``mixed_precision = "bf16"`` on the CPU: frozen base weights in bf16 (norms fp32), LoRA
   weights and optimizer state fp32, matmuls under autocast. Each case runs in a process of
   its own, so its peak RSS (the high-water mark, ``ru_maxrss``) is its own.

The CPU's bf16 units (``avx512_bf16`` / ``amx_bf16`` in ``lscpu``'s flags) and the machine's
load (``uptime``, before and after) are printed with the figures: on a shared machine they
move with what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from childproc import ROOT, StepTimes, parse_or_run_child, peak_rss_mib, run_child

WARMUP = 5  # tiny presets: steps not timed (the first steps build caches and kernels)
SD35 = ROOT / "trainer" / "assets" / "families" / "sd35-medium"
T5_TOKENS, CLIP_TOKENS = 256, 77  # SD 3.5's T5 length (flow_loader.SD3_T5_LENGTH) and CLIP's
RANK, ALPHA = 16, 1.0  # presets/lora/sd35-large-16gb.toml
MEMORY_LIMIT_GIB = 16.0  # of a 24 GB machine shared with other work


def _tiny(preset: str, out: str) -> dict:
    """Runs in a child: the preset as shipped, sampling off, timed per step."""
    sys.path.insert(0, str(ROOT))
    import trainer.run.loop as loop
    from trainer.config.files import load
    from trainer.events import Log

    class Sink(StepTimes):
        def __init__(self) -> None:
            super().__init__()
            self.precision = ""

        def emit(self, event) -> None:
            super().emit(event)
            if isinstance(event, Log) and event.message.startswith("Precision"):
                # "Precision auto: bf16 base weights (why ...)" -> "auto: bf16 base weights"
                self.precision = event.message.removeprefix("Precision ").split(" (")[0]

    cfg = load(ROOT / "presets" / "lora" / f"{preset}.toml",
               [f"saving.output_dir={json.dumps(out)}", "sampling.sample_prompts=[]",
                "training.log_with=\"none\""])
    sink = Sink()
    started = time.perf_counter()
    result = loop.run(cfg, sink)
    assert result.status == "finished", result.error
    return {"steps_per_s": sink.rate(WARMUP), "steps": len(sink.times),
            "wall_s": time.perf_counter() - started, "peak_rss_mib": peak_rss_mib(),
            "precision": sink.precision or cfg.training.mixed_precision}


def _config() -> dict:
    return json.loads((SD35 / "transformer" / "config.json").read_text(encoding="utf-8"))


def sd35_parameters() -> int:
    """The SD 3.5 medium transformer's parameter count, built on the meta device."""
    sys.path.insert(0, str(ROOT))
    import importlib

    import torch

    importlib.import_module("trainer")  # first: it keeps bitsandbytes' chatter out of diffusers
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        model = SD3Transformer2DModel.from_config(_config())
    return sum(p.numel() for p in model.parameters())


def _sd35(precision: str, steps: int, size: int, checkpointing: bool) -> dict:
    """Runs in a child: LoRA steps of the random SD 3.5 medium-size transformer."""
    sys.path.insert(0, str(ROOT))
    from types import SimpleNamespace

    import torch
    from diffusers import SD3Transformer2DModel
    from diffusers.training_utils import cast_training_params

    from trainer.config.files import from_dict
    from trainer.methods.fast_lora import lean_forward
    from trainer.methods.lora import denoiser_lora_config, lora_parameters
    from trainer.models.text_conditioning import TextConditioning
    from trainer.run.cpu_precision import keep_norms_fp32
    from trainer.run.step import batch_loss

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    started = time.perf_counter()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)  # built in the base weights' dtype: one copy, never two
    transformer = SD3Transformer2DModel.from_config(_config())
    torch.set_default_dtype(torch.float32)
    built = time.perf_counter() - started
    cfg = from_dict({"model": {"model_version": "sd3"},
                     "network": {"network_dim": RANK, "network_alpha": ALPHA},
                     "training": {"mixed_precision": "bf16" if precision == "bf16" else "no"},
                     "flow": {"timestep_sampling": "shift"}})
    model = SimpleNamespace(unet=transformer, version="sd3", variant="5-medium")
    transformer.requires_grad_(False)
    transformer.add_adapter(denoiser_lora_config(cfg, model))
    lean_forward(transformer)
    cast_training_params([transformer], dtype=torch.float32)  # LoRA weights fp32
    if dtype == torch.bfloat16:
        keep_norms_fp32(transformer)  # trainer/run/cpu_precision.py: as the run does
    if checkpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    params = lora_parameters(transformer)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    cfg_t = transformer.config
    side = size // 8  # the VAE's factor 8
    batch = SimpleNamespace(
        latents=torch.randn(1, cfg_t.in_channels, side, side, generator=gen), pixels=None,
        text=TextConditioning(
            torch.randn(1, T5_TOKENS + CLIP_TOKENS, cfg_t.joint_attention_dim, generator=gen),
            torch.randn(1, cfg_t.pooled_projection_dim, generator=gen)),
        captions=None, size_ids=None, loss_weights=torch.ones(1), mask=None, rows=None)
    times = []
    for _ in range(steps + 1):  # the first step is a warm-up
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = batch_loss(batch, model, cfg, torch.device("cpu"), dtype)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        assert torch.isfinite(loss), loss
    timed = times[1:]
    return {"build_s": built, "first_s": times[0], "step_s": sum(timed) / len(timed),
            "peak_rss_mib": peak_rss_mib(), "threads": torch.get_num_threads(),
            "lora_params": sum(p.numel() for p in params)}


def _case(kind: str, *args) -> dict:
    return _tiny(*args) if kind == "tiny" else _sd35(*args)


def bf16_units() -> str:
    try:
        flags = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown (no lscpu)"
    line = next((x for x in flags.splitlines() if x.startswith("Flags:")), "")
    found = [f for f in ("avx512_bf16", "amx_bf16") if f in line.split()]
    model = next((x.split(":", 1)[1].strip() for x in flags.splitlines()
                  if x.startswith("Model name:")), "unknown CPU")
    return f"{model}; bf16 units: {', '.join(found) or 'none (bf16 is emulated)'}"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny-only", action="store_true", help="skip the SD 3.5 medium step")
    parser.add_argument("--sd35-steps", type=int, default=1,
                        help="timed SD 3.5 steps per precision (after one warm-up step)")
    parser.add_argument("--size", type=int, default=256, help="SD 3.5 image side in px")
    parser.add_argument("--checkpointing", action="store_true",
                        help="gradient checkpointing in the SD 3.5 step (the presets' setting)")
    args = parse_or_run_child(parser, _case)
    os.environ["KOHYA_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"CPU: {bf16_units()}, {os.cpu_count()} cores")
    print(f"load before: {uptime()}")
    print(f"\ntiny presets as shipped (64 px, batch 2), sampling off; steps/s after {WARMUP} "
          f"steps")
    print(f"{'preset':<12}{'steps/s':>9}{'run s':>8}{'peak RSS MiB':>14}  precision")
    for preset in ("tiny-flux", "tiny-sd3"):
        r = run_child(__file__, ["tiny", preset, tempfile.mkdtemp(prefix="bench-out-")])
        print(f"{preset:<12}{r['steps_per_s']:>9.2f}{r['wall_s']:>8.1f}"
              f"{r['peak_rss_mib']:>14.0f}  {r['precision']}", flush=True)
    if args.tiny_only:
        return
    count = sd35_parameters()
    print(f"\nSD 3.5 medium-size transformer (trainer/assets/families/sd35-medium, random "
          f"weights): {count / 1e9:.2f} G parameters; one LoRA step at {args.size} px, batch 1, "
          f"rank {RANK}, cached latents and text outputs ({T5_TOKENS} T5 + {CLIP_TOKENS} CLIP "
          f"tokens), gradient checkpointing {'on' if args.checkpointing else 'off'}")
    print(f"{'precision':<10}{'s/step':>8}{'steps/s':>9}{'first s':>9}{'build s':>9}"
          f"{'peak RSS MiB':>14}")
    sd35 = {}
    for precision, width in (("bf16", 2), ("fp32", 4)):
        need = count * width / 2**30 * 1.25  # weights and a quarter for the step
        free = available_gib()
        if need > min(MEMORY_LIMIT_GIB, free):
            print(f"{precision:<10}skipped: needs ~{need:.1f} GiB, limit {MEMORY_LIMIT_GIB:g}, "
                  f"available {free:.1f} GiB")
            continue
        r = sd35 = run_child(__file__, ["sd35", precision, args.sd35_steps, args.size,
                                        args.checkpointing])
        print(f"{precision:<10}{r['step_s']:>8.1f}{1 / r['step_s']:>9.3f}{r['first_s']:>9.1f}"
              f"{r['build_s']:>9.1f}{r['peak_rss_mib']:>14.0f}", flush=True)
    if sd35:
        print(f"(torch threads {sd35['threads']}; LoRA parameters "
              f"{sd35['lora_params'] / 1e6:.1f} M; s/step: the mean of the timed steps, "
              f"after one warm-up step)")
    print(f"load after: {uptime()}")


if __name__ == "__main__":
    main()
