"""SDXL-size and SD 1.5-size LoRA: the advisor's peak memory on a GPU for each memory option
(model.base_precision, training.blocks_to_swap) at 512 / 768 / 1024 px, and what it says to
change first on 8 / 10 / 12 / 16 GB cards. No weights: the families' shipped laws and counts.

    python bench/sd_advisor_table.py

The presets' LoRA (rank 8), bf16, batch 1, gradient checkpointing, latents cached; sd-scripts'
SDXL LoRA docs put such a run at 1024 px with --fp8_base (or --cache_text_encoder_outputs) on
8-12 GB cards.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = (("full", None), ("fp8", None), ("nf4", None), ("full", 16), ("fp8", 16))
CARDS = (8, 10, 12, 16)
GIB = 2**30


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from train_helpers import preset_config

    from trainer.advisor.estimate import advise
    from trainer.system.device import DeviceInfo

    def card(gb: int) -> DeviceInfo:
        return DeviceInfo(backend="cuda", name="NVIDIA GeForce RTX", torch_device="cuda:0",
                          memory_bytes=gb * GIB, bf16_ok=True, fp16_ok=True,
                          torch_version="2.13.0")

    tmp = Path(tempfile.mkdtemp(prefix="bench-sd-advisor-"))
    start = time.perf_counter()
    for family in ("sdxl", "sd1"):
        folder = ROOT / "trainer" / "assets" / "families" / family
        print(f"\n{family}: peak GiB on each card (fits: yes / no), then the first change "
              f"the advisor names for the plain (full, no swap) run\n")
        print("| px | card | " + " | ".join(
            f"{b}{f', swap {s}' if s else ''}" for b, s in OPTIONS) + " | first change |\n"
            "|---|---|" + "---:|" * len(OPTIONS) + "---|")
        for px in (512, 768, 1024):
            def config(base: str, swap, px=px, folder=folder):
                return preset_config(
                    tmp, model={"pretrained_model_name_or_path": str(folder),
                                "base_precision": base},
                    dataset={"resolution": px, "min_bucket_reso": 256, "max_bucket_reso": px,
                             "bucket_reso_steps": 64},
                    training={"mixed_precision": "bf16", "gradient_checkpointing": True,
                              "train_batch_size": 1, "blocks_to_swap": swap})
            for gb in CARDS:
                cells = []
                for base, swap in OPTIONS:
                    m = advise(config(base, swap), card(gb)).memory
                    cells.append(f"{m.peak / GIB:.1f} {'yes' if m.fits else 'no'}")
                advice = advise(config("full", None), card(gb))
                first = advice.recommendations[0].title if advice.recommendations and \
                    not advice.memory.fits else "-"
                print(f"| {px} | {gb} GB | " + " | ".join(cells) + f" | {first} |")
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
