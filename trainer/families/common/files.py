"""Model files from strangers, checked before anything reads their weights.

A ``.safetensors`` file is 8 bytes of header length (little-endian), a JSON header of that
length (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``)
and the tensors' bytes. :func:`read_safetensors_header` reads only the header and checks it
against the file: a length that runs past the end, a header that is not UTF-8 JSON, an unknown
dtype, offsets that do not match the shape, overlap, leave holes or run past the end of the file
(a cut-short download), metadata that is not text. :func:`check_base_model_file` adds what a
base model must be: not empty, not a folder in a file's name, not a LoRA or an embedding (a
``.ckpt`` that needs more than tensors is refused by ``torch.load(weights_only=True)`` in
:mod:`trainer.families.sd.single_file`).

:func:`quant_layout` reads which of ComfyUI's quantized forms a file is in (legacy "scaled
fp8", the current "mixed" one; trainer/families/common/comfy_quant.py applies the scales) and
refuses the forms nothing here can read (nvfp4, mxfp8), naming the file to download instead.

Each problem is one :class:`ModelFileError` whose message names the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.families.spec import ModelLoadError

MAX_HEADER = 100 * 2**20  # the safetensors library's own limit
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
               "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8, "C64": 8}
LORA_MARKS = ("lora_down", "lora_up", "lora_A.", "lora_B.", "hada_w1", "lokr_w1", ".alpha",
              "lora_unet_", "lora_te_", "lora_te1_", "lora_te2_")
EMBEDDING_KEYS = ({"emb_params"}, {"clip_l", "clip_g"}, {"string_to_param"})


class ModelFileError(ModelLoadError):
    """A model file that cannot be used; the message names the file and what is wrong."""


@dataclass
class SafetensorsHeader:
    path: Path
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    data_start: int = 0  # the file offset of the tensors' bytes (8 + the header's length)


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _short(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _bad(path: Path, what: str) -> ModelFileError:
    return ModelFileError(f"{str(path)!r}: {what}")


def _check_exists(path: Path) -> int:
    if not path.exists():
        raise _bad(path, "no such file")
    if path.is_dir():
        raise _bad(path, "is a folder, not a file (a folder named like a model file); point "
                         "at the file itself, or at a diffusers folder with model_index.json")
    size = path.stat().st_size
    if size == 0:
        raise _bad(path, "is empty (0 bytes): the download or copy did not finish; get the "
                         "file again")
    return size


def _check_tensor(path: Path, name: str, info: Any, data_size: int) -> tuple[int, int]:
    if not isinstance(info, dict):
        raise _bad(path, f"the header's entry {_short(name)!r} is not a tensor description")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise _bad(path, f"tensor {_short(name)!r} has an unknown dtype {str(dtype)[:20]!r}")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and 0 <= d < 2**40 for d in shape)):
        raise _bad(path, f"tensor {_short(name)!r} has an impossible shape {str(shape)[:60]}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise _bad(path, f"tensor {_short(name)!r} has broken data_offsets {str(offsets)[:60]}")
    begin, end = offsets
    need = math.prod(shape) * DTYPE_BYTES[dtype]
    if end < begin or end - begin != need:
        raise _bad(path, f"the header lies about tensor {_short(name)!r}: shape {shape} of "
                         f"{dtype} is {need} bytes, its offsets {begin}..{end} hold "
                         f"{end - begin}")
    if end > data_size:
        raise _bad(path, f"is truncated: tensor {_short(name)!r} ends at byte {end} of the data, "
                         f"but the file holds only {data_size} bytes of data (the download "
                         f"did not finish?); get the file again")
    return begin, end


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """The header of a ``.safetensors`` file, checked against the file (see the module)."""
    path = Path(path).expanduser()
    size = _check_exists(path)
    if size < 8:
        raise _bad(path, f"is {size} bytes: too short for a safetensors file (truncated?)")
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER or length > size - 8:
                raise _bad(path, f"is not a safetensors file, or is truncated: its first bytes "
                                 f"announce a header of {_size(length)} in a file of "
                                 f"{_size(size)}")
            raw = f.read(length)
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _bad(path, f"the header is not UTF-8 text (byte {exc.start}): not a safetensors "
                         "file, or a damaged one") from None
    except (ValueError, RecursionError) as exc:
        raise _bad(path, f"the header is not valid JSON ({str(exc)[:80]}): not a safetensors "
                         "file, or a damaged one") from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object: not a safetensors file")
    try:  # JSON escapes can spell lone surrogates, which no reader of the file accepts
        json.dumps(header, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(path, "the header holds text that is not valid Unicode (a lone surrogate "
                         "escape): a damaged or forged file") from None
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _bad(path, "its __metadata__ is not a table of text values")
    data_size = size - 8 - length
    spans = sorted((_check_tensor(path, name, info, data_size), name)
                   for name, info in header.items())
    position = 0
    for (begin, end), name in spans:
        if begin < position:
            raise _bad(path, f"the header lies about tensor {_short(name)!r}: its bytes overlap "
                             "another tensor's")
        if begin > position:
            raise _bad(path, f"the header leaves a hole before tensor {_short(name)!r}: a "
                             "damaged file")
        position = end
    if position != data_size:
        raise _bad(path, f"holds {data_size - position} bytes after its last tensor that the "
                         "header does not describe: a damaged file")
    return SafetensorsHeader(path, header, metadata, 8 + length)


def kind_of_weights(names: list[str]) -> str | None:
    """'a LoRA' / 'an embedding' when the tensor names say so, else None."""
    keys = set(names)
    if any(keys == e or (e <= keys and len(keys) <= 3) for e in EMBEDDING_KEYS):
        return "a textual-inversion embedding"
    lora = sum(1 for n in names if any(mark in n for mark in LORA_MARKS))
    if names and lora >= max(1, len(names) // 2):
        return "a LoRA"
    return None


def check_base_model_file(path: str | Path, field_name: str) -> None:
    """What a base model's single file must be; raises ModelFileError naming ``field_name``."""
    path = Path(path).expanduser()
    if path.is_dir():
        if path.suffix.lower() in (".safetensors", ".ckpt") and not (
                path / "model_index.json").is_file():
            raise ModelFileError(f"{field_name} = {str(path)!r}: is a folder, not a file (a "
                                 f"folder named like a model file, without model_index.json)")
        return
    try:
        if path.suffix.lower() == ".ckpt":  # torch.load(weights_only=True) refuses the rest
            _check_exists(path)
            return
        if path.suffix.lower() != ".safetensors":
            return
        header = read_safetensors_header(path)
        names = list(header.tensors)
        kind = kind_of_weights(names)
        if not kind:  # ComfyUI's nvfp4 / mxfp8 files are refused, naming the file to get
            quant_layout(header)
    except ModelFileError as exc:
        raise ModelFileError(f"{field_name} = {exc}") from None
    if kind:
        raise ModelFileError(
            f"{field_name} = {str(path)!r}: this is {kind} ({len(names)} tensors such as "
            f"{names[0][:60]!r}), not a base model; give a full checkpoint or diffusers folder "
            "as the base model")


# --- ComfyUI's quantized forms (torch-free: the header, and the few bytes of .comfy_quant) -----

FP8_FORMATS = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}  # ComfyUI's name: dtype
REFUSED_FORMATS = ("nvfp4", "mxfp8")
SCALED_FP8 = "scaled_fp8"  # the legacy form's marker tensor, at the model's prefix
QUANT_METADATA = "_quantization_metadata"
LEGACY_SUFFIXES = (".scale_weight", ".scale_input")
MIXED_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".comfy_quant")


@dataclass(frozen=True)
class QuantLayout:
    """How a file stores its weights in ComfyUI's forms (``CU comfy/utils.py``
    ``convert_old_quants``, ``comfy/ops.py`` ``mixed_precision_ops``).

    ``form``: "plain" (no scales: bf16, or plain fp8 such as ``*_fp8_e4m3fn``), "scaled_fp8"
    (the legacy form: a ``scaled_fp8`` marker tensor, ``<layer>.scale_weight`` and
    ``<layer>.scale_input``) or "mixed" (``<layer>.weight_scale``, ``<layer>.input_scale``,
    per layer a ``<layer>.comfy_quant`` JSON or the header's ``_quantization_metadata``).
    ``scales``: each scaled weight's key -> its scale's key (the weight is ``fp8 * scale``);
    ``formats``: each quantized weight's key -> ComfyUI's format name; ``dropped``: the keys
    that are no weights (markers, scales, input scales, ``comfy_quant``)."""

    form: str = "plain"
    scales: dict[str, str] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)
    dropped: frozenset[str] = frozenset()

    def weight_keys(self, tensors: dict[str, Any]) -> list[str]:
        """The header's keys that are weights (in the file's order)."""
        return [k for k in tensors if k not in self.dropped]


def _instead(path: Path) -> str:
    """The file to download instead of a 4-bit / mxfp8 one (Comfy-Org's names)."""
    stem = re.sub(r"_?(nvfp4|mxfp8|fp4_mixed|fp4_scaled|fp4)", "", path.stem, flags=re.I)
    names = (f"{stem}_bf16{path.suffix}' or '{stem}{path.suffix}" if stem != path.stem
             else "its '_bf16' file")
    return (f"download the bf16 file of the same model instead ('{names}'), or an fp8 one "
            f"('_fp8_e4m3fn', '_fp8_scaled', '_fp8_mixed'): those are read")


def _refuse(path: Path, layer: str, fmt: Any) -> ModelFileError:
    if fmt in REFUSED_FORMATS:
        return _bad(path, f"is quantized in ComfyUI's {fmt} form (layer {_short(layer)!r}), "
                          f"which this trainer cannot read or train on; {_instead(path)}")
    return _bad(path, f"layer {_short(layer)!r} is quantized in an unknown ComfyUI format "
                      f"{str(fmt)[:40]!r}; {_instead(path)}")


def _comfy_quant_json(header: SafetensorsHeader, key: str) -> dict[str, Any]:
    """One layer's ``.comfy_quant`` tensor: uint8 bytes of a JSON object."""
    info = header.tensors[key]
    begin, end = info["data_offsets"]
    if info["dtype"] != "U8" or end - begin > 4096:
        raise _bad(header.path, f"{_short(key)!r} is not ComfyUI's JSON bytes (uint8)")
    with header.path.open("rb") as f:
        f.seek(header.data_start + begin)
        raw = f.read(end - begin)
    try:
        conf = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        conf = None
    if not isinstance(conf, dict):
        raise _bad(header.path, f"{_short(key)!r} holds no JSON object: a damaged file")
    return conf


def _mixed_layers(header: SafetensorsHeader) -> dict[str, Any]:
    """{layer: its JSON} of the mixed form; the header's ``_quantization_metadata`` wins over
    the ``.comfy_quant`` tensors, as in ComfyUI's ``convert_old_quants``."""
    layers = {k[: -len(".comfy_quant")]: _comfy_quant_json(header, k)
              for k in header.tensors if k.endswith(".comfy_quant")}
    if QUANT_METADATA in header.metadata:
        try:
            table = json.loads(header.metadata[QUANT_METADATA])
        except ValueError:
            table = None
        if not isinstance(table, dict) or not isinstance(table.get("layers"), dict):
            raise _bad(header.path, f"its {QUANT_METADATA} entry is not ComfyUI's "
                                    "{\"layers\": {...}} JSON: a damaged file")
        layers.update(table["layers"])
    return layers


def _mixed(header: SafetensorsHeader, layers: dict[str, Any]) -> QuantLayout:
    scales, formats, dropped = {}, {}, set()
    for layer, conf in layers.items():
        fmt = conf.get("format") if isinstance(conf, dict) else None
        if fmt not in FP8_FORMATS:
            raise _refuse(header.path, layer, fmt)
        formats[f"{layer}.weight"] = fmt
        if f"{layer}.weight_scale" in header.tensors:
            scales[f"{layer}.weight"] = f"{layer}.weight_scale"
        dropped |= {layer + s for s in MIXED_SUFFIXES if layer + s in header.tensors}
    return QuantLayout("mixed", scales, formats, frozenset(dropped))


def _legacy(header: SafetensorsHeader) -> QuantLayout | None:
    markers = [k for k in header.tensors if k == SCALED_FP8 or k.endswith("." + SCALED_FP8)]
    if not markers:
        return None
    prefixes = tuple(k[: -len(SCALED_FP8)] for k in markers)
    # the marker's dtype names the fp8 type; a float32 marker means float8_e4m3fn
    fmt = {"F8_E5M2": "float8_e5m2"}.get(header.tensors[markers[0]]["dtype"], "float8_e4m3fn")
    scales, formats, dropped = {}, {}, set(markers)
    for key in header.tensors:
        if not key.startswith(prefixes) or not key.endswith(LEGACY_SUFFIXES):
            continue
        dropped.add(key)
        layer = key.rsplit(".", 1)[0]
        if key.endswith(".scale_weight") and f"{layer}.weight" in header.tensors:
            scales[f"{layer}.weight"] = key
            formats[f"{layer}.weight"] = fmt
    return QuantLayout("scaled_fp8", scales, formats, frozenset(dropped))


def quant_layout(header: SafetensorsHeader) -> QuantLayout:
    """Which of ComfyUI's forms a checked header's file is in (:class:`QuantLayout`); raises
    :class:`ModelFileError` naming the file (and the file to get instead) for nvfp4, mxfp8 and
    unknown formats."""
    layers = _mixed_layers(header)
    if layers:
        return _mixed(header, layers)
    if QUANT_METADATA not in header.metadata:
        legacy = _legacy(header)
        if legacy is not None:
            return legacy
    return QuantLayout()


def read_quant_layout(path: str | Path) -> QuantLayout:
    """:func:`quant_layout` of a file (its header read and checked first)."""
    return quant_layout(read_safetensors_header(path))
