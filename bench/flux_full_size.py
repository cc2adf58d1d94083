"""FLUX.1-dev's four files as users download them, at full size with random weights, and the
peak host memory of loading them.

    python bench/flux_full_size.py --build DIR        # ~17.5 GB of files, a few minutes
    python bench/flux_full_size.py --load DIR [--base fp8|full] [--dtype fp32|bf16]

``--build`` writes, with the key names and shapes of the published files (from the studio's
shipped FLUX.1-dev configs, built on the meta device and named by the studio's own exporters,
which write what ComfyUI and sd-scripts read):

- ``flux1-dev-fp8.safetensors``: the transformer alone in BFL's layout, float8_e4m3fn (the
  scale and norm vectors bf16), 11.9 GB;
- ``ae.safetensors``: the 16-channel autoencoder, bf16;
- ``clip_l.safetensors``: CLIP-L, fp16;
- ``t5xxl_fp8_e4m3fn.safetensors``: T5-XXL's encoder, Linear weights float8_e4m3fn, the rest
  bf16, 4.9 GB.

Each tensor is drawn and written on its own (the file format written by hand: the header, then
the bytes in order), so the build holds one tensor at a time.

``--load`` loads the set in a fresh process as ``train`` does (trainer.models.loader.
load_base_model with model.ae / clip_l / t5xxl) with ``model.base_precision`` = ``--base`` and
``model.fp8_text_encoders`` on, built in ``--dtype``, and prints the peak RSS beside the stored
sizes. The 12 GB preset's options are fp8 base, fp8 T5 and bf16 or fp32 compute.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from childproc import ROOT, parse_or_run_child, peak_rss_mib, run_child

FILES = {"transformer": "flux1-dev-fp8.safetensors", "ae": "ae.safetensors",
         "clip_l": "clip_l.safetensors", "t5xxl": "t5xxl_fp8_e4m3fn.safetensors"}
SAFETENSORS_DTYPES = {"float8_e4m3fn": "F8_E4M3", "bfloat16": "BF16", "float16": "F16",
                      "float32": "F32"}


def _meta_parts() -> dict:
    """The four components from the shipped FLUX.1-dev configs (the big two on the meta
    device)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    assets = ROOT / "trainer" / "assets" / "families" / "flux1-dev"
    parts = {  # small enough to build (the exporters copy their tensors)
        "vae": AutoencoderKL.from_config(
            json.loads((assets / "vae" / "config.json").read_text())),
        "clip_l": CLIPTextModel(CLIPTextConfig.from_pretrained(assets / "text_encoder"))}
    with torch.device("meta"):
        parts["transformer"] = FluxTransformer2DModel.from_config(
            json.loads((assets / "transformer" / "config.json").read_text()))
        parts["t5xxl"] = T5EncoderModel(T5Config.from_pretrained(assets / "text_encoder_2"))
    return parts


def _layouts(parts: dict) -> dict[str, dict]:
    """file -> {key: (shape, dtype name)} in the published layouts."""
    from trainer.families.common.mmdit_checkpoint import (
        clip_tensors,
        flux_tensors,
        t5_tensors,
        vae_tensors,
    )

    def spec(tensors: dict, linear_dtype: str, other: str) -> dict:
        return {k: (tuple(v.shape), linear_dtype if v.dim() >= 2 and "embed" not in k
                    and "shared" not in k else other) for k, v in tensors.items()}

    return {FILES["transformer"]: spec(flux_tensors(parts["transformer"]), "float8_e4m3fn",
                                       "bfloat16"),
            FILES["ae"]: spec(vae_tensors(parts["vae"]), "bfloat16", "bfloat16"),
            FILES["clip_l"]: spec(clip_tensors(parts["clip_l"]), "float16", "float16"),
            FILES["t5xxl"]: spec(t5_tensors(parts["t5xxl"]), "float8_e4m3fn", "bfloat16")}


def _write(path: Path, layout: dict[str, tuple[tuple[int, ...], str]], seed: int) -> int:
    """A .safetensors file of random tensors of ``layout``, one tensor in memory at a time."""
    import torch

    header, offset = {}, 0
    sizes = {"float8_e4m3fn": 1, "bfloat16": 2, "float16": 2, "float32": 4}
    for key, (shape, dtype) in layout.items():
        end = offset + math.prod(shape) * sizes[dtype]
        header[key] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                       "data_offsets": [offset, end]}
        offset = end
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for key, (shape, dtype) in layout.items():
            values = torch.randn(shape, generator=gen) * (0.02 if len(shape) >= 2 else 0.1)
            if key.endswith(("scale", "norm.weight", "layer_norm.weight")):
                values = values + 1
            f.write(values.to(getattr(torch, dtype)).contiguous().view(torch.uint8)
                    .numpy().tobytes())
    return offset


def build(folder: str) -> dict:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for seed, (name, layout) in enumerate(_layouts(_meta_parts()).items()):
        start = time.perf_counter()
        sizes[name] = _write(out / name, layout, seed)
        print(f"wrote {name}: {sizes[name] / 1e9:.2f} GB in {time.perf_counter() - start:.0f} s",
              flush=True)
    return {"bytes": sizes, "peak_rss_mib": peak_rss_mib()}


def load(folder: str, base: str, dtype: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from trainer.config.sections.model import ModelSection
    from trainer.models.loader import load_base_model

    path = Path(folder)
    section = ModelSection(pretrained_model_name_or_path=str(path / FILES["transformer"]),
                           ae=str(path / FILES["ae"]), clip_l=str(path / FILES["clip_l"]),
                           t5xxl=str(path / FILES["t5xxl"]), tokenizer=str(_tokenizers()),
                           base_precision=base, fp8_text_encoders=True)
    start = time.perf_counter()
    model = load_base_model(section, getattr(torch, dtype), t5_frozen=True)
    seconds = time.perf_counter() - start

    def size(module) -> int:
        return sum(t.numel() * t.element_size() for t in module.state_dict().values())

    held = {n: size(getattr(model, n)) for n in ("unet", "vae", "text_encoder",
                                                  "text_encoder_2")}
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(peak_rss_mib()),
            "held_mib": {n: round(b / 2**20) for n, b in held.items()}}


def _tokenizers() -> Path:
    """The embedded tiny FLUX.1's tokenizers (a real one cannot be downloaded here)."""
    from trainer.models.loader import resolve_model_path

    return resolve_model_path("embedded:tiny-flux")


def _case(kind: str, *args):
    return build(*args) if kind == "build" else load(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", metavar="DIR")
    parser.add_argument("--load", metavar="DIR")
    parser.add_argument("--base", default="fp8", choices=["fp8", "full"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parse_or_run_child(parser, _case)
    if args.build:
        result = run_child(__file__, ["build", args.build])
        print(f"built in {args.build}: " + ", ".join(
            f"{n} {b / 1e9:.2f} GB" for n, b in result["bytes"].items())
            + f"; the build's peak RSS {result['peak_rss_mib'] / 1024:.2f} GiB")
    if args.load:
        files = {n: (Path(args.load) / f).stat().st_size for n, f in FILES.items()}
        result = run_child(__file__, ["load", args.load, args.base, args.dtype],
                           HF_HUB_OFFLINE="1")
        print("stored: " + ", ".join(f"{n} {b / 2**30:.2f} GiB" for n, b in files.items())
              + f" ({sum(files.values()) / 2**30:.2f} GiB)")
        print(f"load with base_precision={args.base}, fp8 T5, {args.dtype}: "
              f"{result['seconds']} s, peak RSS {result['peak_rss_mib'] / 1024:.2f} GiB; held "
              + ", ".join(f"{n} {m / 1024:.2f} GiB" for n, m in result["held_mib"].items()))


if __name__ == "__main__":
    main()
