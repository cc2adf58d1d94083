"""Peak memory and seconds per step of a LoRA step with each memory option (issue 19).

    python bench/memory_options.py [--models tiny-flux,sd15] [--options bf16,fp8,nf4,int8]
                                   [--swap 4] [--steps 3] [--px 256]

Each case runs in a fresh process: the denoiser is built with random weights straight in bf16
(the tiny FLUX.1 of the tests, a UNet of SD 1.5's size from its shipped config; on a GPU also
``flux-dev``, FLUX.1-dev's 12B transformer), put through the run's own memory code
(:class:`trainer.models.memory.MemoryPlan`: fp8 storage, bitsandbytes NF4 / int8, block swap),
given LoRA rank 16 on sd-scripts' modules (fp32), and trained for a few steps (bf16 compute,
AdamW, gradient checkpointing with block swap). Memory: on a GPU PyTorch's peak allocation
during the steps; on the CPU the process's peak RSS during the steps (VmHWM, reset through
/proc/self/clear_refs after set-up) and the bytes of the denoiser's weights. bench/gpu_speed.py
--memory-options runs this table on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"tiny-flux": "flux1", "sd15": "sd1", "flux-dev": "flux1"}


def _denoiser(name: str, device):
    import torch

    if name == "tiny-flux":
        from trainer.families.common.tiny_mmdit import build_flux_components

        return build_flux_components()["transformer"].to(torch.bfloat16)
    from diffusers import FluxTransformer2DModel, UNet2DConditionModel

    folder = ROOT / "trainer/assets/families" / ("sd1" if name == "sd15" else "flux1-dev")
    cls = UNet2DConditionModel if name == "sd15" else FluxTransformer2DModel
    config = cls.load_config(folder / ("unet" if name == "sd15" else "transformer"))
    torch.set_default_dtype(torch.bfloat16)  # no fp32 copy at any time
    try:
        return cls.from_config(config)
    finally:
        torch.set_default_dtype(torch.float32)


def _inputs(name: str, model, px: int, device):
    import torch

    c, side = model.config, px // 8
    b = dict(device=device, dtype=torch.bfloat16)
    if name == "sd15":
        return dict(sample=torch.randn(1, 4, side, side, **b), timestep=torch.tensor([500]),
                    encoder_hidden_states=torch.randn(1, 77, c.cross_attention_dim, **b),
                    return_dict=False)
    tokens, text = (side // 2) ** 2, 32 if name == "tiny-flux" else 512
    return dict(hidden_states=torch.randn(1, tokens, c.in_channels, **b),
                encoder_hidden_states=torch.randn(1, text, c.joint_attention_dim, **b),
                pooled_projections=torch.randn(1, c.pooled_projection_dim, **b),
                timestep=torch.tensor([0.5], **b), img_ids=torch.zeros(tokens, 3, device=device),
                txt_ids=torch.zeros(text, 3, device=device), return_dict=False,
                guidance=torch.tensor([1.0], **b) if c.guidance_embeds else None)


def _prepare(name: str, option: str, swap: int, device):
    import torch
    from peft import inject_adapter_in_model

    from trainer.config.files import from_dict
    from trainer.methods.lora import denoiser_lora_config
    from trainer.models.memory import MemoryPlan

    base = "full" if option == "bf16" else option
    cfg = from_dict({"model": {"base_precision": base},
                     "network": {"network_dim": 16, "network_alpha": 16.0},
                     "training": {"blocks_to_swap": swap or None,
                                  "gradient_checkpointing": bool(swap)}})
    model = SimpleNamespace(unet=_denoiser(name, device), version=MODELS[name])
    model.unet.requires_grad_(False)
    plan = MemoryPlan(cfg, model, torch.bfloat16, device)
    plan.begin(device.type, device.type.upper(), lambda *_: None)
    if not plan.holds(model.unet):
        model.unet.to(device)
    inject_adapter_in_model(denoiser_lora_config(cfg, model), model.unet)
    params = [p for n, p in model.unet.named_parameters() if "lora_" in n]
    for p in params:
        p.data = p.data.float()
    plan.finish(lambda m: None)
    if swap:
        model.unet.enable_gradient_checkpointing()
    return model.unet.train(), params


def _vmhwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def case(name: str, option: str, swap: int, steps: int, px: int) -> dict:
    import torch

    import trainer  # noqa: F401 - bitsandbytes deferred, as in a run

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, params = _prepare(name, option, swap, device)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]
                  if t.device == device)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    inputs = _inputs(name, model, px, device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(**inputs)[0]
        out.float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _vmhwm()
    return {"weights": weights, "peak": peak, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tiny-flux,sd15")
    parser.add_argument("--options", default="bf16,fp8,nf4,int8")
    parser.add_argument("--swap", type=int, default=0, help="also each option with this many "
                        "blocks swapped (CUDA)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--px", type=int, default=256)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["HF_HUB_OFFLINE"] = "1"
    if args.child:
        name, option, swap = args.child
        print(json.dumps(case(name, option, int(swap), args.steps, args.px)))
        return
    load = os.getloadavg()[0]
    print(f"{args.px} px, batch 1, LoRA rank 16, {args.steps} timed steps; load {load:.1f} "
          f"on {os.cpu_count()} cores\n")
    print("| model | base | swap | weights MiB | peak GiB | s/step |")
    print("|---|---|---:|---:|---:|---:|")
    for name in args.models.split(","):
        for option in args.options.split(","):
            for swap in sorted({0, args.swap}):
                cmd = [sys.executable, __file__, "--child", name, option, str(swap),
                       "--steps", str(args.steps), "--px", str(args.px)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    reason = (done.stderr.strip().splitlines() or ["?"])[-1][:120]
                    print(f"| {name} | {option} | {swap} | - | - | {reason} |", flush=True)
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {name} | {option} | {swap} | {r['weights'] / 2**20:.1f} | "
                      f"{r['peak'] / 2**30:.2f} | {r['seconds']:.2f} |", flush=True)
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
