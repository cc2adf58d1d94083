"""FLUX.2's split files as people download them for ComfyUI (the diffusion model, the text
encoder, the VAE), at full size but sparse: each file's safetensors header holds the release's
key names and shapes, built on the meta device from the shipped configs, and its data is a hole
of the right size (nothing is read but the headers). The advisor reads such files as it reads
the real ones (bench/flow_advisor_table.py, tests/test_flux2_advisor.py).

- transformer: ``Flux2Transformer2DModel`` of ``trainer/assets/families/flux2-<variant>``
  (diffusers layout), bf16 or fp8 (the Linear weights that fp8 storage casts);
- text encoder: klein's Qwen3 (``Qwen3ForCausalLM`` without ``lm_head``), dev's
  ``Mistral3ForConditionalGeneration`` in ComfyUI's names (:func:`text_layout`), bf16;
- VAE: ``AutoencoderKLFlux2``, bf16.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAFETENSORS = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float32": "F32"}
BYTES = {"bfloat16": 2, "float8_e4m3fn": 1, "float32": 4}


def write_sparse(path: Path, layout: dict[str, tuple[tuple[int, ...], str]]) -> Path:
    """A safetensors file of ``layout`` (key -> (shape, dtype)): the header, then a hole."""
    header, offset = {}, 0
    for key, (shape, dtype) in layout.items():
        end = offset + math.prod(shape) * BYTES[dtype]
        header[key] = {"dtype": SAFETENSORS[dtype], "shape": list(shape),
                       "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)
    return path


def _assets(variant: str) -> Path:
    return ROOT / "trainer" / "assets" / "families" / f"flux2-{variant}"


def transformer_layout(variant: str, fp8: bool) -> dict:
    import re

    import diffusers
    import torch

    from trainer.models.memory import SKIP_PATTERNS

    config = json.loads((_assets(variant) / "transformer" / "config.json").read_text())
    with torch.device("meta"):
        model = diffusers.Flux2Transformer2DModel.from_config(config)
    out = {}
    for name, module in model.named_modules():
        cast = fp8 and isinstance(module, torch.nn.Linear) and \
            not any(re.search(p, name) for p in SKIP_PATTERNS)
        for pname, p in module.named_parameters(recurse=False):
            out[f"{name}.{pname}"] = (tuple(p.shape), "float8_e4m3fn" if cast and
                                      pname == "weight" else "bfloat16")
    return out


def text_layout(variant: str) -> dict:
    """klein's Qwen3 without ``lm_head`` (ComfyUI's qwen_3_4b.safetensors has none: tied);
    dev's Mistral-Small-3 as ComfyUI's mistral_3_small_flux2_bf16.safetensors holds it: the
    language model under the original names (``model.``, 40 layers, ``lm_head``), the vision
    tower and projector beside it."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(_assets(variant) / "text_encoder"))
    if config.model_type == "qwen3":
        with torch.device("meta"):
            model = transformers.Qwen3ForCausalLM(config)
        return {k: (tuple(v.shape), "bfloat16") for k, v in model.state_dict().items()
                if k != "lm_head.weight"}
    with torch.device("meta"):
        model = transformers.Mistral3ForConditionalGeneration(config)
    names = (("model.language_model.", "model."), ("model.vision_tower.", "vision_tower."),
             ("model.multi_modal_projector.", "multi_modal_projector."), ("lm_head.", "lm_head."))
    return {next(new + k[len(old):] for old, new in names if k.startswith(old)):
            (tuple(v.shape), "bfloat16") for k, v in model.state_dict().items()}


def vae_layout() -> dict:
    import diffusers
    import torch

    config = json.loads((_assets("klein-4b") / "vae" / "config.json").read_text())
    with torch.device("meta"):
        model = diffusers.AutoencoderKLFlux2.from_config(config)
    return {k: (tuple(v.shape), "float32" if k.startswith("bn.") else "bfloat16")
            for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def flux2_files(folder: Path, variant: str, fp8: bool = False) -> dict[str, str]:
    """The three files of a release (``klein-4b``, ``klein-9b``, ``dev``) in ``folder``:
    {"transformer", "text_encoder", "ae"} -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tag = "fp8" if fp8 else "bf16"
    return {"transformer": str(write_sparse(folder / f"flux2-{variant}-{tag}.safetensors",
                                            transformer_layout(variant, fp8))),
            "text_encoder": str(write_sparse(folder / f"text-encoder-{variant}.safetensors",
                                             text_layout(variant))),
            "ae": str(write_sparse(folder / "flux2-vae.safetensors", vae_layout()))}
