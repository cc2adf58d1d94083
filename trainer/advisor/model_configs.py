"""The component configs of the model a config names, read without loading a weight, and the
advisor's cache of what it has computed from them.

The configs: a diffusers folder's ``*/config.json``; for a single file, the family its header
names (:mod:`trainer.families.sd.detect`) and that family's built-in configs or
``model.config_dir``; for the embedded models, their builders' (the family's memory role,
``trainer/families/<folder>/memory.py``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENCODERS = ("text_encoder", "text_encoder_2")
# Config entries that do not shape a step (the libraries' bookkeeping, which all begin with
# "_" but the class name, and the pipelines' default size): left out of the key, so that a
# downloaded model's configs find the laws made for the family's.
NOT_SHAPE = ("transformers_version", "architectures", "torch_dtype", "dtype", "sample_size")
_LOCK = threading.RLock()  # a simulation may ask for another
_CACHE: dict[str, Any] = {}


@dataclass(frozen=True)
class ModelConfigs:
    family: str  # the family's folder: "sdxl" or "sd" (SD 1.x and 2.x build alike)
    unet: dict
    vae: dict
    text_encoders: tuple[tuple[str, dict], ...]  # (component, config)
    source: str
    load_extra_bytes: int  # read into memory beside the built weights while loading

    @property
    def version(self) -> str:
        """The ``model_version`` a model of these configs is loaded as (the folder's first
        family: SD 1.x for "sd")."""
        from trainer.families import names, spec

        return next(n for n in names(denoiser="unet") if spec(n).folder == self.family)

    @property
    def key(self) -> str:
        return json.dumps([self.family, shape(self.unet), shape(self.vae),
                           [(name, shape(c)) for name, c in self.text_encoders]], sort_keys=True)


def shape(config: dict) -> dict:
    """A component's config less what does not shape a step (:data:`NOT_SHAPE`)."""
    return {k: v for k, v in config.items() if k not in NOT_SHAPE
            and (k == "_class_name" or not k.startswith("_"))}


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _largest_weights(folder: Path) -> int:
    return max((p.stat().st_size for p in folder.glob("*/*.*") if p.suffix in (".safetensors",
                                                                             ".bin")), default=0)


def folder_configs(folder: Path, source: str, load_extra: int | None = None) -> ModelConfigs:
    encoders = tuple((name, _read(folder / name / "config.json")) for name in ENCODERS
                     if (folder / name / "config.json").is_file())
    return ModelConfigs(
        family="sdxl" if len(encoders) > 1 else "sd", unet=_read(folder / "unet/config.json"),
        vae=_read(folder / "vae/config.json"), text_encoders=encoders, source=source,
        load_extra_bytes=_largest_weights(folder) if load_extra is None else load_extra)


def embedded_configs(value: str) -> ModelConfigs:
    """The configs of an embedded model: as shipped (:mod:`trainer.advisor.shipped`) while
    its builder is the one they came from, else from the builder (nothing is written: a run
    may be building its folder at the same time)."""
    def build() -> ModelConfigs:
        from trainer.advisor.shipped import embedded_configs as shipped

        found = shipped(value)
        if found is None:
            return built_configs(value)
        return ModelConfigs(found["family"], found["unet"], found["vae"],
                            tuple((n, c) for n, c in found["text_encoders"]), value, 0)
    return cached("embedded:" + value, build)


def built_configs(value: str) -> ModelConfigs:
    """The configs of an embedded model, from its builder (seconds: diffusers and the tiny
    model)."""
    from trainer.families import role, spec
    from trainer.models.loader import EMBEDDED_MODELS

    def build() -> ModelConfigs:
        family = EMBEDDED_MODELS[value]
        parts = role(family, "memory").tiny_components()
        encoders = tuple((name, parts[name].config.to_dict()) for name in ENCODERS
                         if parts.get(name) is not None)
        return ModelConfigs(spec(family).folder, dict(parts["unet"].config),
                            dict(parts["vae"].config), encoders, value, 0)
    return cached("built:" + value, build)


def read_configs(section: Any) -> ModelConfigs:
    """The component configs of ``model`` (a ``ModelSection``); reads no weight. Raises
    ``ModelLoadError`` naming the setting."""
    from trainer.families.spec import ModelLoadError
    from trainer.models.loader import EMBEDDED_MODELS, FIELD, resolve_model_path

    if section.pretrained_model_name_or_path in EMBEDDED_MODELS:
        return embedded_configs(section.pretrained_model_name_or_path)
    path = resolve_model_path(section.pretrained_model_name_or_path)
    try:
        if path.is_dir():
            return folder_configs(path, str(path))
        if path.is_file() and path.suffix.lower() in (".safetensors", ".ckpt"):
            family, extra = _file_family(path)
            folder = (Path(section.config_dir).expanduser() if section.config_dir
                      else family.config_dir(section.prediction_type or "epsilon"))
            return folder_configs(folder, str(path), load_extra=extra)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: cannot read its configs ({exc})") from None
    raise ModelLoadError(f"{FIELD} = {str(path)!r}: not a diffusers folder nor a "
                         f".safetensors/.ckpt file")


def _file_family(path: Path) -> tuple[Any, int]:
    """(the family, the bytes read beside the built weights while it loads) of a single file:
    a ``.safetensors`` file streams (trainer/models/streamed_load.py: one group of tensors and
    the largest tensor at a time), read from its header alone; a ``.ckpt`` is read whole."""
    from trainer.families import detect_path
    from trainer.families.common.files import read_safetensors_header
    from trainer.families.sd import single_file
    from trainer.families.sd.detect import FAMILIES
    from trainer.models.streamed_load import GROUP_BYTES

    if path.suffix.lower() == ".safetensors":
        found = detect_path(path)
        sizes = [end - begin for begin, end in (
            entry["data_offsets"] for entry in read_safetensors_header(path).tensors.values())]
        return FAMILIES[found.family], GROUP_BYTES + max(sizes, default=0)
    with single_file.Checkpoint(path) as ckpt:
        return single_file.inspect(ckpt).family, path.stat().st_size


def cached(key: str, build: Any) -> Any:
    """One simulation per key for the life of the process (they take seconds)."""
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = build()
        return _CACHE[key]


def forget(key: str) -> None:
    with _LOCK:
        _CACHE.pop(key, None)
