"""Single files without the double copy: a component is built from a .safetensors file tensor
by tensor, so the peak memory is the built modules plus one small group of tensors.

diffusers' single-file loading takes the whole component as a dict of tensors: an SD 1.5 fp16
file then peaked at 6.4 GiB RSS against 4.0 GiB of fp32 modules (the fp16 copies, and the file's
pages mapped by safetensors, on top of the modules). Here diffusers still does everything it
does (the key conversion, the configs, the dtype rules), but on *meta* tensors of the file's
shapes: its conversion only renames keys and takes views (slices, reshapes, transposes), so
each converted tensor is a source tensor or a view of one. Where diffusers would copy the
converted dict into the meta-built model, :func:`streamed` hands it over a group at a time,
each read from the file with plain reads (no mapping of the file), resolved to the same view,
and let go; a large one is read into pages of its own, which go back to the system with it.

A tensor the conversion computes from one file tensor (OpenCLIP's q/k/v split with
``clone()``, its transposed projection) is rebuilt by replaying the recorded calls on the real
tensor (trainer/models/meta_recipes.py). A converted tensor that is none of these makes
:class:`NotStreamable` so that the caller loads that component the old way.

A diffusers folder's models go the same way (:func:`streamed_folders`): diffusers' own
``from_pretrained`` builds each on meta and fills it from the file's state dict, which it takes
from safetensors as a whole (every tensor a view of the file mapped in full), so a bf16
transformer loaded in fp32 held the whole file's pages beside the fp32 copy (a Z-Image at
real width: 3.67 GB against 2.59 GB loaded). Here that state dict reads each tensor from the
file as diffusers takes it, into pages of its own that go back once it is cast and set.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.models.meta_recipes import Recorder

GROUP_BYTES = 8 * 2**20  # tensors handed over together: the file's copies alive at once beside
# the built weights (the SD UNet's largest tensor is 13 MiB in fp16, its text encoder's 72)
MAPPED_BYTES = 2**20  # a tensor this large is read into pages of its own (_buffer)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_PATCH_LOCK = threading.RLock()  # the GUI's runner may load while another thread inspects


class NotStreamable(Exception):
    """The conversion made a tensor that is not a view of one file tensor."""


class SafetensorsReader:
    """A .safetensors file's header, and each tensor read on request with ``os.pread``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size > os.fstat(f.fileno()).st_size - 8:
                raise ValueError(f"{self.path}: not a .safetensors file (its header would be "
                                 f"longer than the file)")
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        self.start = 8 + size
        self.entries = header

    def meta(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """Meta tensors of the file's shapes and dtypes (no memory)."""
        return {k: torch.empty(self.entries[k]["shape"], dtype=DTYPES[self.entries[k]["dtype"]],
                               device="meta") for k in keys}

    def read(self, key: str) -> torch.Tensor:
        entry = self.entries[key]
        begin, end = entry["data_offsets"]
        dtype, shape = DTYPES[entry["dtype"]], entry["shape"]
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        buffer = _buffer(end - begin)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            view, done = memoryview(buffer), 0
            while done < len(buffer):
                n = os.preadv(fd, [view[done:]], self.start + begin + done)
                if n <= 0:
                    raise OSError(f"{self.path}: the file ends inside {key}")
                done += n
        finally:
            os.close(fd)
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)


def _buffer(size: int) -> Any:
    """Room for one file tensor. A large one gets pages of its own (an anonymous memory map),
    which go back to the system as soon as the tensor is let go: read into the malloc heap,
    the file's fp16 tensors left holes between the fp32 weights built from them that the heap
    kept (an SD 1.5 file: 0.12 GiB of RSS more)."""
    if size < MAPPED_BYTES:
        return bytearray(size)
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0))
    return mmap.mmap(-1, size)


def scratch(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``like`` in ``dtype``, in pages of its own when large (:func:`_buffer`): for a cast's
    intermediate, which freed into the heap left the same holes as the file's copies."""
    size = like.numel() * dtype.itemsize
    if size < MAPPED_BYTES or like.dtype == dtype:
        return like.to(dtype)
    out = torch.frombuffer(_buffer(size), dtype=dtype).reshape(like.shape)
    return out.copy_(like)


def _resolve(value: Any, sources: dict[int, str], reader: SafetensorsReader,
             recorder: Optional[Recorder] = None) -> Any:
    """The real tensor for a converted entry: a source, a view of one, one computed from a
    source (replayed), or already real."""
    if not isinstance(value, torch.Tensor) or value.device.type != "meta":
        return value
    if id(value) in sources:
        return reader.read(sources[id(value)])
    base = value._base
    if base is not None and id(base) in sources:
        real = reader.read(sources[id(base)])
        return torch.as_strided(real, value.size(), value.stride(), value.storage_offset())
    if recorder is not None and recorder.knows(value):
        try:
            return recorder.replay(value, lambda i: reader.read(sources[i]) if i in sources
                                   else None)
        except KeyError:
            raise NotStreamable("a converted tensor is computed from more than the file's "
                                "tensors") from None
    raise NotStreamable("a converted tensor is computed, not a view of the file's tensors")


def _groups(state_dict: dict[str, Any]) -> Iterator[list[tuple[str, Any]]]:
    group: list[tuple[str, Any]] = []
    size = 0
    for name, value in state_dict.items():
        group.append((name, value))
        size += value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0
        if size >= GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


@dataclass
class Storage:
    """Weights that arrive in a storage form of their own (fp8, bitsandbytes' NF4 / int8)
    rather than the loader's dtype: ``select(model)`` names them once the model is built (and
    may swap in the layers that hold them); each is set as ``convert(tensor)`` of the file's
    tensor, never cast to the loader's dtype first, or by ``place(model, name, tensor)``."""

    select: Callable[[torch.nn.Module], set[str]]
    convert: Callable[[torch.Tensor], torch.Tensor]
    place: Optional[Callable[[torch.nn.Module, str, torch.Tensor], None]] = None


def fill(model: torch.nn.Module, tensors: dict[str, torch.Tensor], names: set[str],
         storage: Storage, load: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``load(model, tensors, ...)`` (diffusers' ``load_model_dict_into_meta``) for all but
    ``names``, which are set in their storage form (a full-width copy of them is never made,
    but for one tensor's while ``storage`` quantizes it)."""
    from accelerate.utils import set_module_tensor_to_device

    load(model, {n: t for n, t in tensors.items() if n not in names}, *args, **kwargs)
    for name in names.intersection(tensors):
        expected = tuple(model.get_parameter(name).shape)
        if tuple(tensors[name].shape) != expected:
            raise ValueError(f"{name}: the file's tensor has shape {tuple(tensors[name].shape)},"
                             f" the model's {expected}")
        if storage.place is not None:
            storage.place(model, name, tensors[name])
            continue
        value = storage.convert(tensors[name])
        set_module_tensor_to_device(model, name, "cpu", value=value, dtype=value.dtype)


@contextmanager
def streamed(reader: SafetensorsReader, sources: dict[str, torch.Tensor],
             storage: Optional[Storage] = None,
             dtype: Optional[torch.dtype] = None) -> Iterator[None]:
    """While inside, diffusers' single-file loaders fill their meta-built models a group of
    tensors at a time, read from ``reader`` for the meta tensors in ``sources``; the weights
    that ``storage`` selects go straight into their storage dtype. ``dtype``: what the others
    are filled in, for a loader called without ``torch_dtype`` (so that it does not cast the
    whole model at its end, the stored weights included)."""
    from diffusers.loaders import single_file_model, single_file_utils

    by_id = {id(t): k for k, t in sources.items()}
    original = single_file_utils.load_model_dict_into_meta
    recorder = Recorder(set(by_id))  # what the conversion computes from the file's tensors
    selected: dict[int, set[str]] = {}

    def load(model: Any, state_dict: dict[str, Any], *args: Any, **kwargs: Any) -> list[str]:
        if any(_resolve_check(v, by_id) and not recorder.knows(v) for v in state_dict.values()):
            raise NotStreamable("a converted tensor is computed, not a view of the file's")
        kwargs.pop("unexpected_keys", None)
        if dtype is not None:
            kwargs["dtype"] = dtype
        if storage is not None and id(model) not in selected:
            selected[id(model)] = storage.select(model)
        recorder.active = False
        try:
            for group in _groups(state_dict):
                tensors = {n: _resolve(v, by_id, reader, recorder) for n, v in group}
                if storage is None:
                    original(model, tensors, *args, **kwargs)
                else:
                    fill(model, tensors, selected[id(model)], storage, original, *args,
                         **kwargs)
        finally:
            recorder.active = True
        return []

    with _PATCH_LOCK:
        saved = single_file_model.load_model_dict_into_meta
        single_file_model.load_model_dict_into_meta = load
        single_file_utils.load_model_dict_into_meta = load
        try:
            with recorder:
                yield
        finally:
            single_file_model.load_model_dict_into_meta = saved
            single_file_utils.load_model_dict_into_meta = original


def _resolve_check(value: Any, by_id: dict[int, str]) -> bool:
    """True when ``value`` could not be resolved (checked before anything loads)."""
    if not isinstance(value, torch.Tensor) or value.device.type != "meta":
        return False
    base = value._base
    return id(value) not in by_id and (base is None or id(base) not in by_id)


def load_streamed(reader: SafetensorsReader, keys: list[str],
                  build: Callable[[dict[str, torch.Tensor]], torch.nn.Module],
                  storage: Optional[Storage] = None,
                  dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """``build`` (a diffusers single-file loader called with a dict) run on meta tensors of
    ``keys``, filled from the file as it loads (``storage``, ``dtype``: see :func:`streamed`);
    raises :class:`NotStreamable` before any weight is read when the conversion computes
    tensors."""
    sources = reader.meta(keys)
    with streamed(reader, sources, storage, dtype):
        return build(sources)


class LazyStateDict(MutableMapping):
    """A .safetensors file's state dict whose tensors are read from the file each time one is
    taken (:meth:`SafetensorsReader.read`) and kept by nobody but the taker: diffusers'
    ``load_model_dict_into_meta`` takes one, casts it and sets it, and the file's copy goes.
    A value set in it (a key renamed by ``_fix_state_dict_keys_on_load``) is kept as given."""

    def __init__(self, reader: SafetensorsReader):
        self.reader = reader
        self._entries: dict[str, Any] = {key: key for key in reader.entries}

    def __getitem__(self, key: str) -> Any:
        value = self._entries[key]
        return self.reader.read(value) if isinstance(value, str) else value

    def __setitem__(self, key: str, value: Any) -> None:
        self._entries[key] = value

    def __delitem__(self, key: str) -> None:
        del self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


@contextmanager
def streamed_folders() -> Iterator[None]:
    """While inside, diffusers' ``from_pretrained`` of a model (a folder's UNet, transformer,
    VAE: every ``ModelMixin``) takes each .safetensors file of it as a :class:`LazyStateDict`,
    so the file is never mapped whole beside the built model; all else is diffusers' own (the
    config, meta init, ``torch_dtype``, ``_keep_in_fp32_modules``, missing / unexpected keys).
    A file the reader cannot open goes to diffusers' reader, which names what is wrong."""
    from diffusers.models import model_loading_utils, modeling_utils

    original = model_loading_utils.load_state_dict

    def load_state_dict(checkpoint_file: Any, disable_mmap: bool = False,
                        map_location: Any = "cpu") -> Any:
        if isinstance(checkpoint_file, LazyStateDict):
            return checkpoint_file
        if (isinstance(checkpoint_file, (str, os.PathLike))
                and str(checkpoint_file).endswith(".safetensors")
                and str(map_location) == "cpu"):
            try:
                reader = SafetensorsReader(Path(checkpoint_file))
            except (OSError, ValueError):
                reader = None
            if reader is not None and all(e.get("dtype") in DTYPES
                                          for e in reader.entries.values()):
                return LazyStateDict(reader)
        return original(checkpoint_file, disable_mmap=disable_mmap, map_location=map_location)

    with _PATCH_LOCK:
        saved = modeling_utils.load_state_dict
        modeling_utils.load_state_dict = load_state_dict
        model_loading_utils.load_state_dict = load_state_dict
        try:
            yield
        finally:
            modeling_utils.load_state_dict = saved
            model_loading_utils.load_state_dict = original
