"""A full-size FLUX.1-dev LoRA run to step 1, as a user on a 24 GiB machine would start it,
with the peak host memory of each phase.

    python bench/flux_full_size.py --build DIR      # the four files, once (~17.5 GB)
    python bench/flux_full_train.py DIR [--avx2] [--dtype no|bf16] [--base fp8|nf4|full]

The run (issue 29's): the files of ``--build`` (the transformer in BFL's layout in fp8, ae,
clip_l, T5-XXL in fp8), ``model.base_precision = --base`` (fp8 storage; bitsandbytes' NF4,
quantized as the file streams; or the compute dtype), ``model.fp8_text_encoders``, LoRA rank
4, 64 px, batch 1, ``t5xxl_max_token_length = 128``, gradient checkpointing, one step;
``training.mixed_precision = --dtype`` ("no": fp32 compute). ``--avx2`` limits PyTorch's CPU
kernels to AVX2, as on a CPU without bf16 units. The run is a fresh process; its peak RSS
(VmHWM, reset at each phase's start through /proc/self/clear_refs) is printed per phase:

- load: the text encoders and the VAE (the transformer waits: trainer/run/text_first.py);
- text cache: every caption encoded, then the text encoders let go;
- transformer: streamed from its file into its storage;
- step 1: the adapters, the latents (encoded as the first epoch reaches them on the CPU) and
  the first step.

``--base full`` holds the transformer in the compute dtype (FLUX.1-dev: 22 GiB in bf16, 44 in
fp32): where that and the rest of the run (:data:`REST_GIB`) exceed the machine's memory, the
estimate is printed and the run is not started.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from childproc import ROOT, parse_or_run_child, run_child

# what the run holds beside the transformer at step 1: the fp8 run peaked at 13.77 GiB with
# its 11.09 GiB transformer (the adapters, the latents, the activations, Python and torch)
REST_GIB = 2.7


def train(folder: str, precision: str, base: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from flux_full_size import FILES, _tokenizers
    from PIL import Image

    from trainer.config.files import from_dict
    from trainer.run.loop import run

    path, work = Path(folder), Path(tempfile.mkdtemp(prefix="flux-full-train-"))
    images = work / "data" / "1_circle"
    images.mkdir(parents=True)
    Image.new("RGB", (64, 64), (200, 40, 40)).save(images / "circle.png")
    (images / "circle.txt").write_text("a red square", encoding="utf-8")
    cfg = from_dict({
        "mode": "lora",
        "model": {"pretrained_model_name_or_path": str(path / FILES["transformer"]),
                  "ae": str(path / FILES["ae"]), "clip_l": str(path / FILES["clip_l"]),
                  "t5xxl": str(path / FILES["t5xxl"]), "tokenizer": str(_tokenizers()),
                  "base_precision": base, "fp8_text_encoders": True,
                  "t5xxl_max_token_length": 128},
        "dataset": {"train_data_dir": str(work / "data"), "resolution": 64,
                    "min_bucket_reso": 64, "max_bucket_reso": 64, "bucket_reso_steps": 64},
        "network": {"network_dim": 4, "network_alpha": 4},
        "training": {"max_train_steps": 1, "train_batch_size": 1, "mixed_precision": precision,
                     "gradient_checkpointing": True},
        "saving": {"output_dir": str(work / "out"), "save_precision": "bf16"}})
    from host_phases import PhasePeaks

    sink = PhasePeaks(echo=True)  # the marks of bench/host_phases.py
    result = run(cfg, sink)
    return {"status": result.status, "error": result.error, "phases": sink.done}


def _case(folder: str, precision: str, base: str = "fp8") -> dict:
    return train(folder, precision, base)


def full_width_gib(path: Path, precision: str) -> float:
    """The transformer's size in the compute dtype (from the file's header: no tensor read)."""
    import json
    import math

    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    count = sum(math.prod(entry["shape"]) for entry in header.values())
    return count * (2 if precision == "bf16" else 4) / 2**30


def mem_total_gib() -> float:
    with open("/proc/meminfo", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemTotal")) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?")
    parser.add_argument("--dtype", default="no", choices=["no", "bf16"])
    parser.add_argument("--avx2", action="store_true")
    parser.add_argument("--base", default="fp8", choices=["fp8", "nf4", "full"],
                        help="model.base_precision of the run")
    args = parse_or_run_child(parser, _case)
    env = {"HF_HUB_OFFLINE": "1", "KOHYA_STUDIO_PROGRESS": "lines"}
    if args.avx2:
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    stored = {n: (Path(args.folder) / f).stat().st_size / 2**30 for n, f in _files().items()}
    print("stored: " + ", ".join(f"{n} {g:.2f} GiB" for n, g in stored.items()))
    print(f"base: {args.base}, compute: {'fp32' if args.dtype == 'no' else args.dtype}")
    if args.base == "full":
        wide = full_width_gib(Path(args.folder) / _files()["transformer"], args.dtype)
        need, have = wide + REST_GIB, mem_total_gib()
        print(f"  transformer in the compute dtype: {wide:.1f} GiB, step 1 about {need:.0f} GiB")
        if need > have:
            print(f"not run: needs about {need:.0f} GiB, this machine has {have:.1f}")
            return
    result = run_child(__file__, [args.folder, args.dtype, args.base], **env)
    print(f"run: {result['status']}" + (f" ({result['error']})" if result["error"] else ""))
    total = 0.0
    for phase in result["phases"]:
        total += phase["seconds"]
        name = "step 1" if phase["phase"] == "step" else phase["phase"]
        print(f"  {name:<12} peak RSS {phase['peak'] / 2**30:6.2f} GiB, "
              f"{phase['seconds']:6.1f} s (at {total:.0f} s)")


def _files() -> dict:
    from flux_full_size import FILES

    return FILES


if __name__ == "__main__":
    main()
