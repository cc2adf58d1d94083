"""FLUX.1-dev and SD 3.5 large LoRA on the meta device: the advisor's peak memory for each
memory option at 512 / 768 / 1024 px, the cheapest combination it recommends for 24 / 16 / 12 /
10 / 8 GB cards, beside sd-scripts' published FLUX.1 table (its docs/flux_train_network.md,
all with --fp8_base: 24 GB batch 2; 16 GB batch 1 with swap; 12 GB swap 16 + AdamW8bit; 10 GB
swap 22; 8 GB swap 28 + fp8 T5; its blocks count double blocks twice: 16 of them is about
5 G parameters, 36 of our units).

    python bench/flow_advisor_table.py      (also run by bench/advisor_memory.py --flow)

LoRA rank 16, AdamW8bit, gradient checkpointing, cached latents and text outputs, as the
FLUX.1-dev presets train.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SD_SCRIPTS = {24: "batch 2", 16: "batch 1 + swap", 12: "swap 16 + AdamW8bit", 10: "swap 22",
              8: "swap 28 + fp8 T5"}
MODELS = ("flux1-dev", "sd35-large")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from trainer.advisor.advice import GIB
    from trainer.advisor.flow_advice import FlowOption, cheapest_fit, flow_memory
    from trainer.config.files import from_dict

    cfg = from_dict({"network": {"network_dim": 16, "network_alpha": 1.0},
                     "optimizer": {"optimizer_type": "AdamW8bit"},
                     "training": {"gradient_checkpointing": True}})
    options = [FlowOption("full"), FlowOption("fp8"), FlowOption("fp8", 8), FlowOption("fp8", 16),
               FlowOption("nf4"), FlowOption("int8"), FlowOption("fp8", None, 2)]
    start = time.time()
    for name in MODELS:
        config = json.loads((ROOT / "trainer/assets/families" / name / "transformer/config.json")
                            .read_text())
        print(f"\n### {name} LoRA (GiB at the step's peak)\n")
        print("| px | " + " | ".join(o.words() for o in options) + " |")
        print("|---:|" + "---:|" * len(options))
        for px in (512, 768, 1024):
            peaks = [flow_memory(config, cfg, (px, px), o, None).peak / GIB for o in options]
            print(f"| {px} | " + " | ".join(f"{p:.1f}" for p in peaks) + " |")
        print("\n| card | 512 px | 768 px | 1024 px | sd-scripts (FLUX.1, 1024 px) |")
        print("|---|---|---|---|---|")
        for gb, theirs in SD_SCRIPTS.items():
            cells = []
            for px in (512, 768, 1024):
                found = cheapest_fit(config, cfg, (px, px), gb * GIB, 2)
                cells.append(f"{found[0].words()} ({found[1].peak / GIB:.1f})" if found
                             else "nothing fits")
            theirs = theirs if name == MODELS[0] else ""
            print(f"| {gb} GB | " + " | ".join(cells) + f" | {theirs} |")
    print(f"\n{time.time() - start:.0f} s for both models (first answers; repeated ones are "
          f"cached)")


if __name__ == "__main__":
    main()
