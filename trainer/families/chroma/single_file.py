"""Load a Chroma single file (and its part files) offline into ``ChromaPipeline``'s modules.

- **The transformer** streams from the file tensor by tensor into its meta-built modules
  (trainer/models/streamed_load.py) through diffusers' own
  ``ChromaTransformer2DModel.from_single_file`` (``convert_chroma_transformer_checkpoint_to_
  diffusers``), in the run's dtype, or into fp8 storage (``model.base_precision = "fp8"``) or
  bitsandbytes' NF4 / int8 layers as its tensors arrive: the whole transformer is never held in
  the compute dtype. diffusers 0.42's converter splits ``single_blocks.N.linear1`` with
  Chroma's fixed width (3072), so for another width (the tiny twin's file) ``linear1`` is split
  here by the header's width and diffusers converts the rest.
- **The VAE** (``model.ae``: FLUX.1's ``ae.safetensors``) and **T5** (``model.t5xxl``:
  ``t5xxl_fp16.safetensors`` / ``t5xxl_fp8_e4m3fn.safetensors``) are built by
  :mod:`trainer.families.common.mmdit_parts` as FLUX.1's; either may also be inside the file
  (a whole checkpoint), and a setting replaces what the file holds.
- **Configs**: ``model.config_dir`` per component, else ``trainer/assets/families/chroma1-hd``;
  a transformer that is not the published size gets the header's shapes.
- ComfyUI's quantized files (``Chroma1-HD-fp8mixed.safetensors``, the legacy scaled fp8): each
  weight is read as ``fp8 * scale`` (:mod:`trainer.families.common.comfy_quant`), then stored as
  the run asks (``model.base_precision = "fp8"`` keeps it in fp8 again).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.chroma.detect import ASSET, ChromaFileInfo, chroma_info
from trainer.families.common.files import QuantLayout, read_quant_layout
from trainer.families.common.mmdit_detect import FILES, VAE_PREFIXES
from trainer.families.common.mmdit_parts import (
    Weights,
    build_text_encoder,
    complete,
    fail,
    text_prefix,
)
from trainer.families.spec import ASSETS, ModelLoadError
from trainer.models.memory import fp8_storage

FIELD = "model.pretrained_model_name_or_path"
WIDTH = 3072  # the width diffusers' Chroma converter assumes
SETTINGS = {"vae": "model.ae", "t5xxl": "model.t5xxl"}


def shipped_config() -> dict[str, Any]:
    return json.loads((ASSETS / ASSET / "transformer" / "config.json").read_text("utf-8"))


def read_info(weights: Weights) -> tuple[ChromaFileInfo, QuantLayout]:
    """The file's facts from its header, and how it stores its weights (ComfyUI's forms)."""
    try:
        layout = read_quant_layout(weights.path)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{weights.setting} = {exc}") from None
    keys = [k for k in weights.keys if k not in layout.dropped]
    return chroma_info(keys, weights.shape, weights.dtype, shipped_config()), layout


def split_linear1(tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, Any]:
    """diffusers' Chroma conversion for a width other than 3072: ``linear1`` split here."""
    from diffusers.loaders.single_file_utils import (
        convert_chroma_transformer_checkpoint_to_diffusers,
    )

    inner = config["num_attention_heads"] * config["attention_head_dim"]
    saved = {}
    for i in range(config["num_single_layers"]):
        for kind in ("weight", "bias"):
            key = f"single_blocks.{i}.linear1.{kind}"
            saved[(i, kind)] = tensors.pop(key)
            rows = (7 * WIDTH,) + saved[(i, kind)].shape[1:]
            tensors[key] = torch.empty(rows, device="meta")  # what the converter splits
    out = convert_chroma_transformer_checkpoint_to_diffusers(tensors)
    for (i, kind), tensor in saved.items():
        q, k, v, mlp = torch.split(tensor, [inner, inner, inner, tensor.shape[0] - 3 * inner])
        block = f"single_transformer_blocks.{i}."
        for name, part in (("attn.to_q", q), ("attn.to_k", k), ("attn.to_v", v),
                           ("proj_mlp", mlp)):
            out[f"{block}{name}.{kind}"] = part
    return out


def _storage(fp8: bool, quantized: Optional[str], dtype: torch.dtype) -> Any:
    if fp8:
        return fp8_storage(dtype)
    if not quantized:
        return None
    from trainer.models.memory import SKIP_PATTERNS
    from trainer.models.quantize import quantized_storage

    return quantized_storage(quantized, dtype, SKIP_PATTERNS)


def build_transformer(weights: Weights, info: ChromaFileInfo, root: Path, dtype: torch.dtype,
                      fp8: bool = False, quantized: Optional[str] = None,
                      layout: Optional[QuantLayout] = None) -> torch.nn.Module:
    """The transformer, streamed from the file into its modules (see the module's notes)."""
    from diffusers import ChromaTransformer2DModel

    from trainer.families.common.comfy_quant import ComfyQuantReader, load_tensors
    from trainer.models.memory import store_fp8, to_compute_dtype
    from trainer.models.streamed_load import NotStreamable, SafetensorsReader, load_streamed

    prefix = info.prefixes["transformer"]
    others = tuple(p for part, p in info.prefixes.items() if part != "transformer")
    layout = layout or QuantLayout()
    keys = [k for k in weights.keys if k.startswith(prefix) and k not in layout.dropped
            and not (not prefix and others and k.startswith(others))]
    config = info.transformer_config
    split = config["num_attention_heads"] * config["attention_head_dim"] != WIDTH
    where = f"{FIELD} = {str(weights.path)!r}"

    def build(tensors: dict[str, torch.Tensor], cast: bool = True) -> torch.nn.Module:
        tensors = {k[len(prefix):]: v for k, v in tensors.items()}
        return ChromaTransformer2DModel.from_single_file(
            split_linear1(tensors, config) if split else tensors, config=str(root),
            subfolder="transformer", local_files_only=True, torch_dtype=dtype if cast else None)

    storage = _storage(fp8, quantized, dtype)
    try:
        try:
            reader = SafetensorsReader(weights.path) if layout.form == "plain" else \
                ComfyQuantReader(weights.path, dtype, layout)
            module = load_streamed(reader, keys, lambda t: build(t, cast=storage is None),
                                   storage, dtype)
        except NotStreamable:
            wanted = set(keys)
            module = build(load_tensors(weights.path, dtype, wanted.__contains__, layout))
    except Exception as exc:  # noqa: BLE001 - shape mismatches, missing keys, ...
        raise fail(where, "transformer", exc) from None
    module = complete(module, "transformer", where)
    if fp8 or quantized:
        to_compute_dtype(module, dtype)  # the buffers that no tensor of the file filled
    if fp8:
        store_fp8(module.requires_grad_(False), dtype)
    return module


def transformer_root(info: ChromaFileInfo, config_dir: Optional[Path], stack: ExitStack) -> Path:
    """A folder with ``transformer/config.json``: model.config_dir's, the shipped one, or one
    written now from the header's shapes (the rotary axes of a 128-wide head: Chroma's)."""
    if config_dir and (config_dir / "transformer" / "config.json").is_file():
        return config_dir
    if info.published_size:
        return ASSETS / ASSET
    config = {**shipped_config(), **info.transformer_config}
    if config["attention_head_dim"] != 128:
        raise ModelLoadError(f"{FIELD}: its Chroma transformer has heads "
                             f"{config['attention_head_dim']} wide (Chroma: 128), so its rotary "
                             f"axes are unknown; set model.config_dir to a folder with "
                             f"transformer/config.json")
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chroma-config-")))
    (root / "transformer").mkdir()
    (root / "transformer" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def config_root(config_dir: Optional[Path], component: str) -> Path:
    if config_dir and (config_dir / component / "config.json").is_file():
        return config_dir
    return ASSETS / ASSET


def sources(info: ChromaFileInfo, main: Weights, settings: dict[str, Optional[str]]
            ) -> dict[str, tuple[Weights, Optional[str]]]:
    """part -> (open file, prefix or None to find); one error naming every missing setting."""
    out, missing = {}, []
    for part, setting in SETTINGS.items():
        if settings.get(part):
            out[part] = (Weights(Path(settings[part]).expanduser(), setting), None)
        elif part in info.prefixes:
            out[part] = (main, info.prefixes[part])
        else:
            missing.append(part)
    if missing:
        lines = "; ".join(f"set {SETTINGS[p]} to {FILES[p]}" for p in missing)
        raise ModelLoadError(f"{FIELD} = {str(main.path)!r} is Chroma and holds no "
                             f"{', '.join(missing)}: {lines}")
    return out


def vae_prefix(weights: Weights) -> str:
    return next((p for p in VAE_PREFIXES if any(k.startswith(p + "decoder.")
                                                 for k in weights.keys)), "")


def transformer_later(path: Path, info: ChromaFileInfo, conf: Optional[Path], fp8: bool,
                      quantized: Optional[str], layout: QuantLayout
                      ) -> Callable[[torch.dtype], Any]:
    """``build(dtype)``: the file's transformer (for a run that encodes the captions first)."""

    def build(dtype: torch.dtype) -> Any:
        with ExitStack() as stack:
            return build_transformer(Weights(path, FIELD), info,
                                     transformer_root(info, conf, stack), dtype, fp8, quantized,
                                     layout)

    return build


def build_t5(weights: Weights, prefix: Optional[str], info: ChromaFileInfo,
             conf: Optional[Path], dtype: torch.dtype, fp8: bool) -> torch.nn.Module:
    found = text_prefix(weights, "t5xxl") if prefix is None else prefix
    return build_text_encoder(weights, found, "t5xxl", info, config_root(conf, "text_encoder"),
                              dtype, fp8)
