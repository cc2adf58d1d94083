"""FLUX.1 Kontext [dev], Qwen-Image-Edit and Qwen-Image-Edit-2509 LoRA on the meta device, with
one control (reference) image: the advisor's device peak for each memory option at 1024 px,
batch 1 (beside the same step without the control), the text encoder's phase, the host memory
(RAM) at the run's peak, and the cheapest combination it recommends for 24 and 16 GB cards,
beside what musubi-tuner and ai-toolkit publish for these models.

    python bench/edit_advisor_table.py

The models are diffusers folders at full size but sparse (bench/edit_files.py), the dataset one
1024 px target with its 1024 px control in ``dataset.control_dir``, so the advisor reads them
as a user's. The control's sequence: Kontext's reference resized to BFL's preferred resolution
nearest its aspect (1024 x 1024: 4096 more image tokens); Qwen-Image-Edit's in the target's
bucket (4096 more), and Qwen2.5-VL reads it too (Edit at its 1024 px, 1369 vision tokens;
2509 at about 384 px, 196), whose tokens stay in the text sequence the transformer reads.
LoRA and optimizer as the presets train (presets/lora/flux1-kontext-dev-*.toml: rank 32;
presets/lora/qwen-image-edit-*.toml: rank 16; AdamW8bit, gradient checkpointing, cached
latents and text outputs).

What the peers publish (read at kohya-ss/musubi-tuner 30c658c and ostris/ai-toolkit 27a03a9;
our summaries):

- musubi-tuner docs/qwen_image.md, "VRAM Usage Estimates with Memory Saving Options": for a
  Qwen-Image LoRA at 1024 x 1024, batch 1, bf16, gradient checkpointing: 42 GB with no option,
  30 GB with fp8 base (scaled), 24 GB adding 16 blocks swapped, 12 GB with 45; 64 GB of RAM
  advised with block swap. It adds that Qwen-Image-Edit training needs more memory for the
  control images, with no figure; --fp8_vl (the text encoder in fp8) is advised below 16 GB.
- musubi-tuner docs/flux_kontext.md: no memory figure; its example trains rank 32, AdamW8bit,
  gradient checkpointing, with --fp8 / --fp8_scaled for the DiT and --fp8_t5 to save memory.
- ai-toolkit config/examples/train_lora_flux_kontext_24gb.yaml: a 24 GB example with the
  transformer quantized to 8 bit, batch 1, rank 16, trained at 512 and 768 px; its comment says
  Kontext runs the images at twice the latent size and may run out of memory at 1024 px on a
  24 GB card.
- ai-toolkit config/examples/train_lora_qwen_image_edit_32gb.yaml and
  train_lora_qwen_image_edit_2509_32gb.yaml: 32 GB examples, the transformer quantized to 3 bit
  (uint3 with an accuracy recovery adapter; its comment: 3 bit is required for 32 GB), the text
  encoder in float8, low_vram, text embeddings cached (required for 32 GB, its comment says),
  batch 1, 512 to 1024 px, rank 16. It publishes no 24 or 16 GB setting for them.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (model folder, the preset whose training settings it runs, what it is called)
MODELS = (("flux1-kontext-dev", "flux1-kontext-dev-24gb", "FLUX.1 Kontext [dev]"),
          ("qwen-image-edit", "qwen-image-edit-24gb", "Qwen-Image-Edit"),
          ("qwen-image-edit-2509", "qwen-image-edit-24gb", "Qwen-Image-Edit-2509"))
PEERS = {
    "flux1-kontext-dev": "musubi-tuner: no figure (fp8 / fp8_scaled DiT, fp8 T5 advised); "
                         "ai-toolkit: 24 GB example with an 8-bit transformer at 512-768 px, "
                         "'may OOM at 1024 px with 24GB'",
    "qwen-image-edit": "musubi-tuner (Qwen-Image, no control): 42 GB plain, 30 fp8, 24 fp8 + "
                       "swap 16, 12 fp8 + swap 45, 'Edit needs more for the control images'; "
                       "ai-toolkit: 32 GB example with a 3-bit transformer and fp8 text encoder",
    "qwen-image-edit-2509": "as Qwen-Image-Edit (ai-toolkit's 2509 example: 32 GB, 3-bit "
                            "transformer, fp8 text encoder, up to 3 control folders)",
}
CARDS = (24, 16)


def dataset(folder: Path) -> Path:
    """One 1024 px target (captioned with its instruction) and its 1024 px control."""
    from PIL import Image

    (folder / "1_edit").mkdir(parents=True, exist_ok=True)
    (folder / "control").mkdir(exist_ok=True)
    Image.new("RGB", (1024, 1024), (200, 60, 30)).save(folder / "1_edit" / "a.png")
    (folder / "1_edit" / "a.txt").write_text("make the square red")
    Image.new("RGB", (1024, 1024), (30, 60, 200)).save(folder / "control" / "a.png")
    return folder


def config(model: Path, preset: str, data: Path, out: Path, control: bool = True, **changes):
    """The preset with the model, the dataset and ``changes`` (dotted; None unsets), from a
    bf16 base with no block swap and the text encoder in bf16."""
    from trainer.config import files as config_io

    path = ROOT / "presets" / "lora" / f"{preset}.toml"
    raw = config_io.load_toml_text(path.read_text(encoding="utf-8"), str(path))
    given = {"model.pretrained_model_name_or_path": str(model),
             "dataset.train_data_dir": str(data), "saving.output_dir": str(out),
             "model.base_precision": "full", "training.blocks_to_swap": None,
             "model.fp8_text_encoders": False, **changes}
    if control:
        given["dataset.control_dir"] = "control"
    for key, value in given.items():
        section, name = key.split(".")
        if value is None:
            raw.setdefault(section, {}).pop(name, None)
        else:
            raw.setdefault(section, {})[name] = value
    return config_io.from_dict(raw, str(path))


def card(gb: int) -> object:
    from trainer.system.device import DeviceInfo

    return DeviceInfo("cuda", "NVIDIA GeForce RTX", "cuda:0", gb * 2**30, True, True, "2.13")


def recommended(model: Path, preset: str, data: Path, out: Path, gb: int) -> tuple:
    """(the words, the config and the advice with them applied) of the advisor's
    recommendations from bf16."""
    from trainer.advisor.estimate import advise

    advice = advise(config(model, preset, data, out), card(gb))
    changes: dict = {}
    for r in advice.recommendations:
        changes.update(r.changes)
    if any("while the captions are encoded" in p for p in advice.problems):
        changes["model.fp8_text_encoders"] = True  # the least it can need
    words = "; ".join(r.title.split(": ", 1)[-1] for r in advice.recommendations) \
        or "as it is (bf16)"
    chosen = config(model, preset, data, out, **changes)
    return words, chosen, advise(chosen, card(gb))


def table(model: Path, preset: str, name: str, data: Path, out: Path) -> None:
    from trainer.advisor.advice import GIB
    from trainer.advisor.edit_sequence import edit_sequence
    from trainer.advisor.estimate import advise
    from trainer.advisor.flow_advice import FlowOption, flow_memory, flow_transformer_config
    from trainer.advisor.flow_memory import flow_weights

    cfg = config(model, preset, data, out)
    transformer = flow_transformer_config(cfg.model)
    edit = edit_sequence(cfg, (1024, 1024))
    w = flow_weights(transformer, cfg)
    options = [FlowOption("full"), FlowOption("fp8"), FlowOption("fp8", 16),
               FlowOption("fp8", 32), FlowOption("nf4")]
    print(f"\n### {name}: transformer {w.total / 1e9:.1f} B parameters; one control at "
          f"{edit.sizes[0][0]}x{edit.sizes[0][1]} px: +{edit.image_tokens} image tokens"
          + (f", +{edit.text_tokens} text tokens" if edit.text_tokens else "") + "\n")
    print("| 1024 px, batch 1 (GiB) | " + " | ".join(o.words() for o in options) + " |")
    print("|---|" + "---:|" * len(options))
    for label, c in (("step with the control", cfg),
                     ("step without it", config(model, preset, data, out, control=False))):
        peaks = [flow_memory(transformer, c, (1024, 1024), o, None).peak / GIB for o in options]
        print(f"| {label} | " + " | ".join(f"{p:.1f}" for p in peaks) + " |")
    text = {}
    for fp8 in (False, True):
        phases = {p.name: p for p in advise(config(model, preset, data, out, **{
            "model.fp8_text_encoders": fp8}), card(80)).phases}
        text[fp8] = phases["text cache"].device / GIB
    print(f"\ntext encoder phase on the device (with the control): {text[False]:.1f} GiB bf16, "
          f"{text[True]:.1f} GiB fp8 (model.fp8_text_encoders)\n")
    print("| card | advisor's recommendation from bf16 (step GiB) | text encoder phase | "
          "host RAM peak (phase) |")
    print("|---|---|---|---|")
    for gb in CARDS:
        words, chosen, final = recommended(model, preset, data, out, gb)
        peak = final.host_peak()
        te = "fp8" if chosen.model.fp8_text_encoders else "bf16"
        phase = {p.name: p for p in final.phases}["text cache"].device / GIB
        fits = "" if final.memory.fits and not final.problems else " (does not fit)"
        print(f"| {gb} GB | {words} ({final.memory.peak / GIB:.1f}){fits} | {te}, "
              f"{phase:.1f} GiB | {peak.host / GIB:.1f} GiB ({peak.name}) |")
    print(f"\npeers: {PEERS[model.name]}")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from edit_files import edit_folder

    from trainer.advisor.advice import GIB
    from trainer.system import device

    device.system_memory = lambda: 1024 * GIB  # the figures, not this machine's RAM
    work = Path(tempfile.mkdtemp(prefix="edit-table-"))
    data = dataset(work / "data")
    start = time.time()
    for folder, preset, name in MODELS:
        table(edit_folder(work / "models", folder), preset, name, data, work / "out")
    print(f"\n{time.time() - start:.0f} s for the three models (sparse folders built "
          f"included)")


if __name__ == "__main__":
    main()
