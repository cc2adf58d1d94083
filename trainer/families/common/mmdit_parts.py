"""Each part of a FLUX.1 / SD 3.x single file built from its tensors (the entry point, which
file holds which part and the configs are trainer/families/common/mmdit_single_file.py).

- **The transformer** streams from the file tensor by tensor into its meta-built modules
  (trainer/models/streamed_load.py), in the compute dtype, or with fp8 storage
  (``model.base_precision = "fp8"``) into fp8 as the tensors arrive, with ``"nf4"`` /
  ``"int8"`` into bitsandbytes' layers, each weight quantized as it arrives
  (trainer/models/quantize.py): the whole transformer is never held in the compute dtype.
  diffusers' own converter (``FluxTransformer2DModel`` /
  ``SD3Transformer2DModel.from_single_file``) runs on meta tensors; one exception: diffusers
  0.42's FLUX converter splits ``single_blocks.N.linear1`` with FLUX.1's fixed width (3072),
  so for another width (a test model) ``linear1`` is split here by the header's width and
  diffusers converts the rest.
- **The VAE** is diffusers' ``AutoencoderKL.from_single_file`` of its tensors.
- **The text encoders** are transformers' own names in every known file (``text_model.*``,
  ``encoder.block.*``): built on the meta device from their config and filled a group of
  tensors at a time with diffusers' ``load_model_dict_into_meta``; a frozen T5 with
  ``model.fp8_text_encoders`` is stored in fp8 group by group. SD 3's CLIP-L gets an identity
  ``text_projection``, as diffusers' reader gives it (SD 3 pools CLIP-L without projection;
  ComfyUI likewise).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.common.mmdit_detect import (
    FILES,
    TEXT_MARKERS,
    TEXT_PREFIXES,
    FlowFileInfo,
)
from trainer.families.spec import ModelLoadError
from trainer.models.memory import fp8_storage

FLUX_WIDTH = 3072  # the width diffusers' FLUX converter assumes
COMPONENTS = {"flux": {"clip_l": "text_encoder", "t5xxl": "text_encoder_2"},
              "sd3": {"clip_l": "text_encoder", "clip_g": "text_encoder_2",
                      "t5xxl": "text_encoder_3"},
              "chroma": {"t5xxl": "text_encoder"}}
OTHER_PREFIXES = ("cond_stage_model.transformer.", "conditioner.embedders.0.transformer.",
                  "transformer.")


class Weights:
    """An open ``.safetensors`` file: its header, then its tensors by prefix, read when asked."""

    def __init__(self, path: Path, setting: str):
        from safetensors import SafetensorError, safe_open

        self.path, self.setting = path, setting
        try:
            self._handle = safe_open(str(path), framework="pt", device="cpu")
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{setting} = {str(path)!r}: not a readable .safetensors "
                                 f"file ({exc})") from None
        self.keys = list(self._handle.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle.get_slice(key).get_shape())

    def dtype(self, key: str) -> str:
        return self._handle.get_slice(key).get_dtype()

    def tensor(self, key: str) -> torch.Tensor:
        """One tensor as stored (fp8 stays fp8), read with plain reads: safetensors' memory
        map would keep every page it touched resident beside the built module (T5-XXL: 4.9 GB
        of RSS more)."""
        from trainer.models.streamed_load import SafetensorsReader

        if getattr(self, "_reader", None) is None:
            self._reader = SafetensorsReader(self.path)
        return self._reader.read(key)

    def take(self, prefix: str, dtype: torch.dtype, exclude: Iterable[str] = ()
             ) -> dict[str, torch.Tensor]:
        """The tensors under ``prefix`` (not under ``exclude``), prefix removed; fp8 upcast."""
        exclude = tuple(exclude)
        out = {}
        for key in self.keys:
            if key.startswith(prefix) and not (exclude and key.startswith(exclude)):
                tensor = self._handle.get_tensor(key)
                if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                    tensor = tensor.to(dtype)
                out[key[len(prefix):]] = tensor
        return out


def complete(module: torch.nn.Module, what: str, where: str) -> torch.nn.Module:
    """Weights that no tensor filled stay on the meta device: name them."""
    missing = [n for n, t in [*module.named_parameters(), *module.named_buffers()]
               if t.device.type == "meta"]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                          else "")
        raise ModelLoadError(f"{where}: the {what} lacks {len(missing)} weights ({shown}); the "
                             f"file does not match the configs it is loaded with")
    return module.eval()


def fail(where: str, what: str, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"{where}: cannot build the {what} ({exc}). If the file is not the "
                          f"published size, set model.config_dir to a folder of diffusers "
                          f"configs of its shape ({what}/config.json)")


def flux_linear1(tensors: dict[str, torch.Tensor], info: FlowFileInfo) -> dict[str, Any]:
    """diffusers' FLUX conversion for a width other than 3072: ``linear1`` split here."""
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    config = info.transformer_config
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    saved = {}
    for i in range(config["num_single_layers"]):
        for kind in ("weight", "bias"):
            key = f"single_blocks.{i}.linear1.{kind}"
            saved[(i, kind)] = tensors.pop(key)
            rows = (3 * FLUX_WIDTH + 4 * FLUX_WIDTH,) + saved[(i, kind)].shape[1:]
            tensors[key] = torch.empty(rows, device="meta")  # what the converter splits
    out = convert_flux_transformer_checkpoint_to_diffusers(tensors)
    for (i, kind), tensor in saved.items():
        q, k, v, mlp = torch.split(tensor, [inner, inner, inner, tensor.shape[0] - 3 * inner])
        block = f"single_transformer_blocks.{i}."
        for name, part in (("attn.to_q", q), ("attn.to_k", k), ("attn.to_v", v),
                           ("proj_mlp", mlp)):
            out[f"{block}{name}.{kind}"] = part
    return out


def build_transformer(weights: Weights, info: FlowFileInfo, root: Path, dtype: torch.dtype,
                      fp8: bool = False, quantized: Optional[str] = None):
    """The transformer, streamed from the file tensor by tensor into its modules
    (trainer/models/streamed_load.py); with ``fp8`` (model.base_precision = "fp8") every layer
    that fp8 storage holds is stored in fp8 as its tensors arrive, with ``quantized`` ("nf4" /
    "int8") every Linear layer that bitsandbytes holds is quantized as its weight arrives
    (trainer/models/quantize.py), so the whole transformer is never held in ``dtype``
    (FLUX.1-dev: 11.9 GB in fp8, about 6.7 in NF4, 23.8 in bf16)."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    from trainer.models.streamed_load import NotStreamable, SafetensorsReader, load_streamed

    prefix = info.prefixes["transformer"]
    others = tuple(p for part, p in info.prefixes.items() if part != "transformer")
    keys = [k for k in weights.keys if k.startswith(prefix)
            and not (not prefix and others and k.startswith(others))]
    cls = FluxTransformer2DModel if info.kind == "flux" else SD3Transformer2DModel
    config = info.transformer_config
    split = info.kind == "flux" and \
        config["num_attention_heads"] * config["attention_head_dim"] != FLUX_WIDTH
    where = f"model.pretrained_model_name_or_path = {str(weights.path)!r}"

    def build(tensors: dict[str, torch.Tensor], cast: bool = True) -> torch.nn.Module:
        tensors = {k[len(prefix):]: v for k, v in tensors.items()}
        return cls.from_single_file(flux_linear1(tensors, info) if split else tensors,
                                    config=str(root), subfolder="transformer",
                                    local_files_only=True, torch_dtype=dtype if cast else None)

    try:
        try:
            # with a storage, diffusers fills in ``dtype`` but skips its closing
            # model.to(dtype), which would upcast every stored weight at once
            storage = fp8_storage(dtype) if fp8 else _quantized_storage(quantized, dtype)
            module = load_streamed(SafetensorsReader(weights.path), keys,
                                   lambda t: build(t, cast=storage is None), storage, dtype)
        except NotStreamable:
            module = build(weights.take(prefix, dtype, exclude=others if not prefix else ()))
    except Exception as exc:  # noqa: BLE001 - shape mismatches, missing keys, ...
        raise fail(where, "transformer", exc) from None
    module = complete(module, "transformer", where)
    if fp8:
        from trainer.models.memory import store_fp8, to_compute_dtype

        to_compute_dtype(module, dtype)  # the buffers that no tensor of the file filled
        store_fp8(module.requires_grad_(False), dtype)  # the hooks; cast what is not yet
    elif quantized:
        from trainer.models.memory import to_compute_dtype

        to_compute_dtype(module, dtype)  # the buffers that no tensor of the file filled
    return module


def _quantized_storage(kind: Optional[str], dtype: torch.dtype) -> Any:
    """NF4 / int8 as the weights arrive, on the layers that MemoryPlan.begin would quantize."""
    if not kind:
        return None
    from trainer.models.memory import SKIP_PATTERNS
    from trainer.models.quantize import quantized_storage

    return quantized_storage(kind, dtype, SKIP_PATTERNS)


def build_vae(weights: Weights, prefix: str, root: Path, dtype: torch.dtype):
    from diffusers import AutoencoderKL

    where = f"{weights.setting} = {str(weights.path)!r}"
    if not any(k.startswith(prefix + "decoder.") for k in weights.keys):
        raise ModelLoadError(f"{where}: no VAE decoder (decoder.* keys) in it; point it at "
                             f"{FILES['vae']}")
    try:
        module = AutoencoderKL.from_single_file(weights.take(prefix, dtype), config=str(root),
                                                subfolder="vae", local_files_only=True,
                                                torch_dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        raise fail(where, "vae", exc) from None
    return complete(module, "vae", where)


def text_prefix(weights: Weights, encoder: str) -> str:
    """Where the encoder's transformers names start in a file of its own (or a combined one)."""
    marker = TEXT_MARKERS[encoder]
    for prefix in (TEXT_PREFIXES[encoder], *OTHER_PREFIXES, ""):
        if prefix + marker in weights.keys:
            return prefix
    raise ModelLoadError(f"{weights.setting} = {str(weights.path)!r}: no {encoder} text encoder "
                         f"in transformers' names ({marker}) in it; point it at "
                         f"{FILES[encoder]}")


def _text_state(tensors: dict[str, torch.Tensor], model: torch.nn.Module, encoder: str,
                identity_projection: bool) -> dict[str, torch.Tensor]:
    if encoder == "t5xxl":
        if "shared.weight" not in tensors and "encoder.embed_tokens.weight" in tensors:
            tensors["shared.weight"] = tensors.pop("encoder.embed_tokens.weight")
        tensors.pop("encoder.embed_tokens.weight", None)  # tied to shared below
        return tensors
    if not hasattr(model, "text_model"):  # transformers 5 flattened CLIPTextModel
        tensors = {k.removeprefix("text_model."): v for k, v in tensors.items()}
    if identity_projection:
        width = model.config.hidden_size
        tensors["text_projection.weight"] = torch.eye(width)
    return tensors


def build_text_encoder(weights: Weights, prefix: str, encoder: str, info: FlowFileInfo,
                       root: Path, dtype: torch.dtype, fp8: bool = False):
    """A text encoder built on the meta device and filled from the file a group of tensors at
    a time (never the whole encoder twice); with ``fp8`` (model.fp8_text_encoders on a frozen
    T5) its stored weights are cast to fp8 as each group arrives."""
    import transformers
    from accelerate import init_empty_weights
    from diffusers.models.model_loading_utils import load_model_dict_into_meta

    from trainer.models.memory import T5_SKIP, store_fp8, to_compute_dtype
    from trainer.models.streamed_load import fill

    component = COMPONENTS[info.kind][encoder]
    where = f"{weights.setting} = {str(weights.path)!r}"
    config_file = root / component / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    cls = getattr(transformers, config["architectures"][0])
    with init_empty_weights():
        model = cls(cls.config_class.from_pretrained(str(root / component)))
    if encoder == "t5xxl":
        model.encoder.set_input_embeddings(model.shared)
    identity = info.kind == "sd3" and encoder == "clip_l"
    files = {k[len(prefix):]: k for k in weights.keys if k.startswith(prefix)}
    named = _text_state(dict(files), model, encoder, identity)  # name -> file key or tensor
    wanted = set(model.state_dict())
    storage = fp8_storage(dtype, T5_SKIP)
    stored = storage.select(model) if fp8 else set()
    try:
        for group in _groups(weights, [(n, v) for n, v in named.items() if n in wanted]):
            fill(model, {n: weights.tensor(v) if isinstance(v, str) else v for n, v in group},
                 stored, storage, load_model_dict_into_meta, dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        raise fail(where, component, exc) from None
    if encoder == "t5xxl":
        model.encoder.set_input_embeddings(model.shared)
    to_compute_dtype(model, dtype)
    model = complete(model, component, where)
    if fp8:
        store_fp8(model.requires_grad_(False), dtype, T5_SKIP)
    return model


GROUP_BYTES = 256 * 2**20  # a text encoder's tensors read and filled together (fp32 sizes)


def _groups(weights: Weights, items: list[tuple[str, Any]]) -> Iterable[list[tuple[str, Any]]]:
    group: list[tuple[str, Any]] = []
    size = 0
    for name, value in items:
        group.append((name, value))
        shape = weights.shape(value) if isinstance(value, str) else tuple(value.shape)
        size += 4 * math.prod(shape)
        if size >= GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group
