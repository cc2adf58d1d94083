"""The training step on a GPU: steps/s, peak memory and model FLOPs utilisation (MFU).

    python bench/gpu_speed.py [--family sd15|sdxl] [--batches 1,4,8] [--compile both]
                              [--checkpointing off] [--steps 30] [--peak-tflops auto]
    python bench/gpu_speed.py --memory-options [--steps 30]   (issue 19's table)

A full-size UNet with random weights (the family's config from trainer/assets/families), LoRA
rank 32 on sd-scripts' modules through the studio's own LoRA set-up (peft + the lean forward),
bf16 autocast, fused AdamW, cached latents and text-encoder outputs as random tensors: the step
the loop runs, without data loading. FLOPs are counted once per configuration with
torch.utils.flop_counter.FlopCounterMode over a forward and backward; the peak is measured with
a large bf16 matmul on the device unless --peak-tflops gives it (H200: about 790 dense bf16).
sd15 trains at 512 px (64x64 latents), sdxl at 1024 px (128x128). On a CPU it runs as a smoke
test (fp32, tiny sizes with --smoke).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAMILIES = {"sd15": ("sd1", 64, 77, 768), "sdxl": ("sdxl", 128, 77, 2048)}


def measured_peak_tflops(device, dtype) -> float:
    import torch

    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def build_unet(family: str, smoke: bool, device, checkpointing: bool):
    from diffusers import UNet2DConditionModel

    from trainer.config import TrainConfig
    from trainer.config.paths import PROJECT_ROOT
    from trainer.methods.fast_lora import lean_forward
    from trainer.methods.lora import unet_lora_config

    folder = PROJECT_ROOT / "trainer" / "assets" / "families" / FAMILIES[family][0] / "unet"
    config = UNet2DConditionModel.load_config(folder)
    if smoke:  # two small blocks: the same code path on a CPU
        config.update(block_out_channels=[32, 64], down_block_types=config["down_block_types"][-2:],
                      up_block_types=config["up_block_types"][:2], layers_per_block=1,
                      attention_head_dim=8, transformer_layers_per_block=1)
    unet = UNet2DConditionModel.from_config(config).to(device)
    unet.requires_grad_(False)
    cfg = TrainConfig()
    cfg.network.network_dim, cfg.network.network_alpha = 32, 32.0
    unet.add_adapter(unet_lora_config(cfg))
    lean_forward(unet)
    params = [p for n, p in unet.named_parameters() if "lora_" in n]
    for p in params:
        p.data = p.data.float()
    if checkpointing:
        unet.enable_gradient_checkpointing()
    unet.train()
    return unet, params


def inputs(family: str, unet, batch: int, device, smoke: bool):
    import torch

    _, side, tokens, width = FAMILIES[family]
    side = 8 if smoke else side
    width = unet.config.cross_attention_dim
    latents = torch.randn(batch, 4, side, side, device=device)
    text = torch.randn(batch, tokens, width, device=device)
    added = None
    if unet.config.addition_embed_type == "text_time":
        added = {"text_embeds": torch.randn(batch, 1280, device=device),
                 "time_ids": torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * batch,
                                          device=device, dtype=torch.float32)}
    return latents, text, added


def run_case(args, family, batch, compiled, checkpointing, peak):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    unet, params = build_unet(family, args.smoke, device, checkpointing)
    unet.to(dtype)
    for p in params:
        p.data = p.data.float()
    if compiled:
        unet.compile()
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    latents, text, added = inputs(family, unet, batch, device, args.smoke)

    def step():
        t = torch.randint(0, 1000, (batch,), device=device)
        with torch.autocast(device.type, dtype=dtype, enabled=cuda):
            pred = unet(latents, t, text, added_cond_kwargs=added).sample
        loss = torch.nn.functional.mse_loss(pred.float(), latents.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    for _ in range(4):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    rate = args.steps / (time.perf_counter() - start)
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    flops = counter.get_total_flops()
    memory = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    mfu = flops * rate / (peak * 1e12) if peak else float("nan")
    flags = f"{'on' if compiled else 'off':>9}{'on' if checkpointing else 'off':>7}"
    print(f"{family:<6}{batch:>6}{flags}"
          f"{first:>10.1f}{rate:>10.2f}{rate * batch:>10.1f}{memory:>10.1f}"
          f"{flops / 1e12:>10.2f}{mfu * 100:>8.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="sd15", choices=sorted(FAMILIES))
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--compile", default="both", choices=("both", "on", "off"))
    parser.add_argument("--checkpointing", default="off", choices=("both", "on", "off"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--peak-tflops", default="auto")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument("--memory-options", action="store_true", help="instead: LoRA with each "
                        "base precision (bf16, fp8, NF4, int8) and block swap on SD 1.5 and "
                        "FLUX.1-dev sizes (bench/memory_options.py)")
    args = parser.parse_args()
    if args.memory_options:
        import subprocess

        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_options.py")
        sys.exit(subprocess.call([sys.executable, script, "--models", "sd15,flux-dev",
                                  "--swap", "16", "--px", "1024", "--steps", str(args.steps)]))
    import torch

    import trainer  # noqa: F401 - bitsandbytes deferred

    cuda = torch.cuda.is_available()
    if args.peak_tflops == "auto":
        peak = measured_peak_tflops("cuda", torch.bfloat16) if cuda else 0.0
    else:
        peak = float(args.peak_tflops)
    name = torch.cuda.get_device_name() if cuda else "CPU (smoke test)"
    print(f"{name}; peak {peak:.0f} TFLOP/s bf16 dense; LoRA rank 32; {args.steps} timed steps")
    print(f"{'model':<6}{'batch':>6}{'compile':>9}{'ckpt':>7}{'step1 s':>10}{'steps/s':>10}"
          f"{'img/s':>10}{'peak GiB':>10}{'TFLOP/st':>10}{'MFU %':>8}")
    both = {"both": (False, True), "on": (True,), "off": (False,)}
    for checkpointing in both[args.checkpointing]:
        for compiled in both[args.compile]:
            for batch in (int(b) for b in args.batches.split(",")):
                run_case(args, args.family, batch, compiled, checkpointing, peak)
                if cuda:  # the case's model is gone with its frame
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
