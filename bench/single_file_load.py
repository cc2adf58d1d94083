"""Peak memory of loading a single file, alone (issue 20): the modules' size against the peak
RSS of a fresh process that only calls load_base_model.

    python bench/single_file_load.py FILE.safetensors [TOKENIZER_DIR]

bench/single_file.py --keep DIR writes an SD 1.5-size fp16 file (DIR/sd15-random.safetensors)
and its tokenizer (DIR/tokenizer). Before the tensor-by-tensor loading
(trainer/models/streamed_load.py) diffusers' loaders took each component as a whole dict of
fp16 tensors read through safetensors' mapping, on top of the fp32 modules.
"""

from __future__ import annotations

import json
import sys

from childproc import ROOT, peak_rss_mib, run_child


def _load(path: str, tokenizer: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from trainer.config import ModelSection
    from trainer.models.loader import load_base_model

    base = peak_rss_mib()
    section = ModelSection(pretrained_model_name_or_path=path,
                           **({"tokenizer": tokenizer} if tokenizer else {}))
    model = load_base_model(section)
    size = sum(t.numel() * t.element_size() for m in (model.unet, model.vae, model.text_encoder)
               for t in [*m.parameters(), *m.buffers()])
    return {"modules_mib": size / 2**20, "peak_rss_mib": peak_rss_mib(), "before_mib": base}


def main() -> None:
    if sys.argv[1] == "--child":
        print(json.dumps(_load(*json.loads(sys.argv[2])[1:])))
        return
    path, tokenizer = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    r = run_child(__file__, ["load", path, tokenizer], HF_HUB_OFFLINE="1")
    print(f"{path}: modules {r['modules_mib'] / 1024:.2f} GiB, peak RSS "
          f"{r['peak_rss_mib'] / 1024:.2f} GiB ({r['peak_rss_mib'] / r['modules_mib']:.2f}x the "
          f"modules; {r['before_mib'] / 1024:.2f} GiB after the imports)")


if __name__ == "__main__":
    main()
