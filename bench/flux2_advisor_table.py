"""FLUX.2 [klein] 4B, 9B and [dev] LoRA on the meta device: the advisor's device peak for each
memory option at 1024 px, batch 1, the text encoder's phase (it encodes every caption first,
alone on the device, and leaves it), the cheapest combination it recommends for 24 / 16 / 12 GB
cards, and the host memory (RAM) the run holds at its peak with that combination, beside
SimpleTuner's published FLUX.2 figures (documentation/quickstart/FLUX2.md).

    python bench/flux2_advisor_table.py

The files are the releases' split files (ComfyUI's names) at full size but sparse
(bench/flux2_files.py: headers built on the meta device), so the advisor reads them as a
user's. LoRA rank 16, AdamW8bit, gradient checkpointing, cached latents and text outputs,
as the klein presets train (presets/lora/flux2-klein-*.toml).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("klein-4b", "klein-9b", "dev")
# SimpleTuner's FLUX.2 quickstart (bghira/SimpleTuner documentation/quickstart/FLUX2.md)
SIMPLETUNER = {"klein-4b": "bf16 ~12 GB, int8 ~8 GB, RAM 32 GB+",
               "klein-9b": "bf16 ~22 GB, int8 ~14 GB, RAM 64 GB+",
               "dev": "int8 everything ~40 GB; int4 TE + int8 transformer ~22 GB; RAM 96 GB "
                      "minimum"}
CARDS = (24, 16, 12)


def config(files: dict, data: Path, out: Path, **changes) -> object:
    from trainer.config import files as config_io

    overrides = [f'model.pretrained_model_name_or_path="{files["transformer"]}"',
                 f'model.text_encoder="{files["text_encoder"]}"', f'model.ae="{files["ae"]}"',
                 f'dataset.train_data_dir="{data}"', f'saving.output_dir="{out}"',
                 "model.base_precision=\"full\"", "training.train_batch_size=1"]
    overrides += [f"{k}={v}" for k, v in changes.items()]
    return config_io.load(ROOT / "presets/lora/flux2-klein-4b-24gb.toml", overrides)


def dataset(folder: Path) -> Path:
    from PIL import Image

    sub = folder / "1_square"
    sub.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (1024, 1024), (30, 60, 200)).save(sub / "a.png")
    (sub / "a.txt").write_text("a blue square")
    return folder


def card(gb: int) -> object:
    from trainer.system.device import DeviceInfo

    return DeviceInfo("cuda", "NVIDIA GeForce RTX", "cuda:0", gb * 2**30, True, True, "2.13")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from flux2_files import flux2_files

    from trainer.advisor.advice import GIB
    from trainer.advisor.estimate import advise
    from trainer.advisor.flow_advice import FlowOption, flow_memory, flow_transformer_config
    from trainer.advisor.flow_memory import flow_weights
    from trainer.system import device

    device.system_memory = lambda: 1024 * GIB  # the figures, not this machine's RAM
    options = [FlowOption("full"), FlowOption("fp8"), FlowOption("fp8", 8),
               FlowOption("fp8", 16), FlowOption("nf4")]
    work = Path(tempfile.mkdtemp(prefix="flux2-table-"))
    data = dataset(work / "data")
    start = time.time()
    for variant in VARIANTS:
        files = flux2_files(work / variant, variant)
        cfg = config(files, data, work / "out")
        transformer = flow_transformer_config(cfg.model)
        w = flow_weights(transformer, cfg)
        print(f"\n### FLUX.2 {variant}: transformer {w.total / 1e9:.2f} B parameters "
              f"({sum(transformer.get(k, 0) for k in ('num_layers', 'num_single_layers'))} "
              f"blocks)\n")
        print("| 1024 px, batch 1 | " + " | ".join(o.words() for o in options) + " |")
        print("|---|" + "---:|" * len(options))
        peaks = [flow_memory(transformer, cfg, (1024, 1024), o, None).peak / GIB
                 for o in options]
        print("| training step (GiB) | " + " | ".join(f"{p:.1f}" for p in peaks) + " |")
        text = {}
        for fp8 in (False, True):
            advice = advise(config(files, data, work / "out",
                                   **{"model.fp8_text_encoders": str(fp8).lower()}), card(80))
            phases = {p.name: p for p in advice.phases}
            text[fp8] = phases["text cache"].device / GIB
        print(f"\ntext encoder phase on the device: {text[False]:.1f} GiB bf16, "
              f"{text[True]:.1f} GiB fp8 (model.fp8_text_encoders)\n")
        print("| card | advisor's recommendation (step GiB) | text encoder phase | host RAM "
              "peak (phase) |")
        print("|---|---|---|---|")
        for gb in CARDS:
            advice = advise(cfg, card(gb))
            changes = {}
            for r in advice.recommendations:
                changes.update(r.changes)
            if any("while the captions are encoded" in p for p in advice.problems):
                changes["model.fp8_text_encoders"] = True  # the least it can need
            chosen = config(files, data, work / "out", **{
                k: (f'"{v}"' if isinstance(v, str) else str(v).lower() if v is not None
                    else '"none"') for k, v in changes.items() if v is not None})
            final = advise(chosen, card(gb))
            peak = final.host_peak()
            words = "; ".join(r.title.split(": ", 1)[-1] for r in advice.recommendations) \
                or "as it is (bf16)"
            te = "fp8" if chosen.model.fp8_text_encoders else "bf16"
            text = {p.name: p for p in final.phases}["text cache"].device
            problem = f", {text / GIB:.1f} GiB" + (" (does not fit)" if any(
                "while the captions" in p for p in final.problems) else "")
            if not final.memory.fits:
                words = "nothing fits"
            print(f"| {gb} GB | {words} ({final.memory.peak / GIB:.1f}) | {te}{problem} | "
                  f"{peak.host / GIB:.1f} GiB ({peak.name}) |")
        print(f"\nSimpleTuner: {SIMPLETUNER[variant]}")
    print(f"\n{time.time() - start:.0f} s for the three releases")


if __name__ == "__main__":
    main()
