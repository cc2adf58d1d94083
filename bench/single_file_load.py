"""Peak memory of loading a single file, alone (issue 20): the modules' size against the peak
RSS of a fresh process that only calls load_base_model.

    python bench/single_file_load.py FILE.safetensors [TOKENIZER_DIR] [--reps 3] [--whole-dict]
                                     [--fp8]

--whole-dict loads as before the tensor-by-tensor loading (each component's tensors as one dict
read through safetensors' mapping), for the before/after figures. --fp8 loads as a bf16 run with
model.base_precision = "fp8" does: the modules' size is then their stored size (the UNet's
fp8 weights at one byte), printed beside the file's size.

bench/single_file.py --keep DIR writes an SD 1.5-size fp16 file (DIR/sd15-random.safetensors)
and its tokenizer (DIR/tokenizer); with --build-only sdxl, an SDXL-size one (6.9 GB).
Before the tensor-by-tensor loading (trainer/models/streamed_load.py) diffusers' loaders took
each component as a whole dict of fp16 tensors read through safetensors' mapping, on top of
the fp32 modules.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from childproc import ROOT, peak_rss_mib, run_child


def _load(path: str, tokenizer: str, whole: bool = False, fp8: bool = False) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from trainer.config import ModelSection
    from trainer.models import streamed_load
    from trainer.models.loader import load_base_model

    if whole:  # the loading before trainer/models/streamed_load.py: each component's dict
        def refuse(*args: object, **kwargs: object) -> None:
            raise streamed_load.NotStreamable("--whole-dict")
        streamed_load.load_streamed = refuse

    base = peak_rss_mib()
    section = ModelSection(pretrained_model_name_or_path=path, base_precision="fp8" if fp8
                           else "full", **({"tokenizer": tokenizer} if tokenizer else {}))
    model = load_base_model(section, torch.bfloat16 if fp8 else None)
    modules = [m for m in (model.unet, model.vae, model.text_encoder, model.text_encoder_2)
               if m is not None]
    size = sum(t.numel() * t.element_size() for m in modules
               for t in [*m.parameters(), *m.buffers()])
    return {"modules_mib": size / 2**20, "peak_rss_mib": peak_rss_mib(), "before_mib": base}


def main() -> None:
    if sys.argv[1] == "--child":
        print(json.dumps(_load(*json.loads(sys.argv[2])[1:])))
        return
    args = sys.argv[1:]
    reps, whole, fp8 = 1, "--whole-dict" in args, "--fp8" in args
    args = [a for a in args if a not in ("--whole-dict", "--fp8")]
    if "--reps" in args:
        at = args.index("--reps")
        reps = int(args[at + 1])
        del args[at:at + 2]
    path, tokenizer = args[0], args[1] if len(args) > 1 else ""
    runs = []
    for _ in range(reps):
        r = run_child(__file__, ["load", path, tokenizer, whole, fp8], HF_HUB_OFFLINE="1")
        runs.append(r)
        print(f"{path}: modules {r['modules_mib'] / 1024:.2f} GiB, peak RSS "
              f"{r['peak_rss_mib'] / 1024:.2f} GiB ({r['peak_rss_mib'] / r['modules_mib']:.2f}x "
              f"the modules; {r['before_mib'] / 1024:.2f} GiB after the imports, so the load "
              f"added {(r['peak_rss_mib'] - r['before_mib']) / r['modules_mib']:.2f}x)",
              flush=True)
    if reps > 1:
        peak = statistics.median(r["peak_rss_mib"] for r in runs)
        added = statistics.median(r["peak_rss_mib"] - r["before_mib"] for r in runs)
        modules = runs[0]["modules_mib"]
        print(f"median of {reps}: peak RSS {peak / 1024:.2f} GiB ({peak / modules:.2f}x the "
              f"modules), the load's own {added / 1024:.2f} GiB ({added / modules:.2f}x); the "
              f"file {os.path.getsize(path) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
