"""What peft's LoRA layer costs per training step, against the lean forward of
trainer/methods/fast_lora.py (peft's maths).

    python bench/lora_overhead.py [--steps 40] [--rounds 3]
    python bench/lora_overhead.py --wide [--tokens 768] [--threads 2] [--rounds 5]

One UNet forward + backward + fused AdamW step at 64 px, batch 1, on the embedded tiny model
with LoRA (rank 8) on the transformer blocks and the ResNet convolutions, 1 thread. Prints
milliseconds of CPU time per step (process time, which a busy machine disturbs less than wall
time) for peft's forward and the lean one, alternated.

``--wide``: one LoRA layer (rank 4, fp32) at FLUX.2 [klein] 4B's widest, the single block's
fused 3072 -> 27648 projection, on ``--tokens`` rows (768: 256 px and 512 text tokens), input
gradient on: the milliseconds of a forward and backward of the frozen layer alone (what any
LoRA adds to), of peft's forward and of the lean one, alternated, median of the rounds.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wide(args) -> None:
    import statistics

    import torch
    from peft import LoraConfig, inject_adapter_in_model

    from trainer.methods.fast_lora import lean_forward

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def layer():
        root = torch.nn.Sequential()
        root.proj = torch.nn.Linear(3072, 27648, bias=False).requires_grad_(False)
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=["proj"]), root)
        return root.proj

    plain = torch.nn.Linear(3072, 27648, bias=False).requires_grad_(False)
    peft_layer, lean_layer = layer(), layer()
    lean_forward(lean_layer)
    x = torch.randn(1, args.tokens, 3072)

    def ms(module) -> float:
        def once():
            xg = x.clone().requires_grad_(True)
            module(xg).sum().backward()
        once()
        start = time.perf_counter()
        for _ in range(3):
            once()
        return (time.perf_counter() - start) / 3 * 1000

    times = {"frozen layer": [], "peft": [], "lean": []}
    for _ in range(args.rounds):
        for name, module in zip(times, (plain, peft_layer, lean_layer)):
            times[name].append(ms(module))
    print(f"one 3072 -> 27648 Linear, {args.tokens} tokens, LoRA rank 4, fp32, "
          f"{args.threads} threads: ms of forward + backward (median of {args.rounds})")
    base = statistics.median(times["frozen layer"])
    for name, values in times.items():
        m = statistics.median(values)
        print(f"  {name}: {m:.1f}" + (f" (LoRA adds {m - base:.1f})" if name != "frozen layer"
                                      else ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wide", action="store_true",
                        help="one LoRA layer at FLUX.2 [klein]'s widest instead")
    parser.add_argument("--tokens", type=int, default=768)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.wide:
        import trainer  # noqa: F401 - bitsandbytes deferred

        return wide(args)
    import torch
    from peft import LoraConfig

    import trainer  # noqa: F401 - bitsandbytes deferred
    from trainer.config import ModelSection
    from trainer.methods.fast_lora import lean_forward
    from trainer.methods.lora import UNET_CONV_TARGETS, UNET_TARGETS
    from trainer.models.loader import load_base_model

    torch.set_num_threads(1)
    model = load_base_model(ModelSection())
    peft_unet = model.unet.requires_grad_(False)
    peft_unet.add_adapter(LoraConfig(r=8, lora_alpha=8, init_lora_weights="gaussian",
                                     target_modules=UNET_TARGETS + UNET_CONV_TARGETS))
    lean_unet = copy.deepcopy(peft_unet)
    layers = lean_forward(lean_unet)
    x, t = torch.randn(1, 4, 8, 8), torch.tensor([500])
    h = torch.randn(1, 77, model.text_encoder.config.hidden_size)

    def ms_per_step(unet) -> float:
        params = [p for p in unet.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)

        def step():
            unet(x, t, h).sample.pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(5):
            step()
        start = time.process_time()
        for _ in range(args.steps):
            step()
        return (time.process_time() - start) / args.steps * 1000

    print(f"tiny UNet, {layers} LoRA layers, 64 px, batch 1, 1 thread: CPU ms/step")
    for r in range(args.rounds):
        peft_ms, lean_ms = ms_per_step(peft_unet), ms_per_step(lean_unet)
        print(f"round {r + 1}: peft {peft_ms:.1f}  lean {lean_ms:.1f}")


if __name__ == "__main__":
    main()
