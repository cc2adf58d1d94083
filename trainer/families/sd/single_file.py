"""Read a single checkpoint file in the original layout into diffusers/transformers modules.

diffusers' own ``from_single_file`` does the key conversion; what this module adds is that it
never needs the network (the configs come from :mod:`trainer.families.sd.detect`' data or
``model.config_dir``) and that it reads the file the way users have it:

- ``.safetensors``: the header alone answers detection (keys, shapes, dtypes, metadata).
- ``.ckpt``: only ``torch.load(weights_only=True)``, which unpickles tensors and plain
  containers and nothing else; a pickle that needs more (a class of the training code, a
  callback) is refused with the reason, since unpickling it could run any code. A
  ``state_dict`` wrapper (PyTorch Lightning's) is unwrapped; its ``global_step`` is kept.
- fp16, bf16 or fp32 weights: every module loads as fp32 (diffusers casts each tensor to the
  dtype of the parameter it fills, and the modules are built in fp32); the loop casts what it
  freezes. With ``model.base_precision = "fp8"`` the UNet's weights that fp8 storage holds
  stream into fp8 instead (an fp8 file's as they are), the rest in the run's compute dtype.
- ``model_ema.*`` keys (EMA copies that unpruned files carry) are never read: training continues
  from the non-EMA weights, as diffusers' converter does by default (``extract_ema=False``).

Memory: the file is never loaded whole. A ``.safetensors`` component streams from the file a
group of tensors at a time (trainer/models/streamed_load.py): the peak is the modules built so
far plus one group (an SD 1.5-size fp16 file: 1.10x its fp32 modules, bench/single_file_load.py).
Where a component cannot stream, :class:`Checkpoint` hands out its weights whole (UNet, VAE,
each text encoder in turn), diffusers builds it on the ``meta`` device and fills it, and its
source tensors are dropped before the next one is read (the UNet's: at most 1.5x the fp32 UNet
for an fp16 file), never the model twice. A ``.ckpt`` is
memory-mapped (``torch.load(mmap=True)``) when it is in the zip format, so its tensors stay in
the page cache; an old-format ``.ckpt`` is read whole, and its tensors are freed per component.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.sd.detect import (
    EMA_PREFIX,
    UNET_PREFIX,
    VAE_PREFIX,
    Detected,
    ModelLoadError,
    TextEncoderSlot,
    detect,
)
from trainer.models.streamed_load import NotStreamable, Storage


class Checkpoint:
    """An open checkpoint: keys, shapes and metadata, then its weights one prefix at a time."""

    def __init__(self, path: Path):
        self.path = path
        self.metadata: dict[str, str] = {}
        self.global_step: Optional[int] = None
        self._handle: Any = None
        self._tensors: dict[str, torch.Tensor] = {}
        if path.suffix.lower() == ".safetensors":
            self._open_safetensors()
        else:
            self._open_ckpt()

    def _open_safetensors(self) -> None:
        from safetensors import SafetensorError, safe_open

        try:
            self._handle = safe_open(str(self.path), framework="pt", device="cpu")
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{self.path}: not a readable .safetensors file ({exc})") from None
        self.metadata = dict(self._handle.metadata() or {})
        self.keys = list(self._handle.keys())

    def _open_ckpt(self) -> None:
        obj = _torch_load(self.path)
        while isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            step = obj.get("global_step")
            self.global_step = step if isinstance(step, int) else self.global_step
            obj = obj["state_dict"]
        if not isinstance(obj, dict):
            raise ModelLoadError(f"{self.path}: the .ckpt holds a {type(obj).__name__}, not a "
                                 f"state dict of tensors")
        self._tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        self.keys = list(self._tensors)

    def shape(self, key: str) -> tuple[int, ...]:
        if self._handle is not None:
            return tuple(self._handle.get_slice(key).get_shape())
        return tuple(self._tensors[key].shape)

    def dtype(self, key: str) -> str:
        """``F16``, ``BF16``, ``F32``: safetensors' names, for torch tensors too."""
        if self._handle is not None:
            return self._handle.get_slice(key).get_dtype()
        names = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}
        return names.get(self._tensors[key].dtype, str(self._tensors[key].dtype))

    def take(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under ``prefix`` (EMA copies never), read now and then forgotten here."""
        wanted = [k for k in self.keys if k.startswith(prefix) and not k.startswith(EMA_PREFIX)]
        taken = set(wanted)
        self.keys = [k for k in self.keys if k not in taken]
        if self._handle is not None:
            return {k: self._handle.get_tensor(k) for k in wanted}
        return {k: self._tensors.pop(k) for k in wanted}

    def load_part(self, prefix: str, build: Any, storage: Optional[Storage] = None
                  ) -> torch.nn.Module:
        """``build(tensors under prefix)``; from a .safetensors file, tensor by tensor into the
        meta-built module (trainer/models/streamed_load.py: no second copy of the weights), the
        weights that ``storage`` selects straight into its dtype."""
        if self._handle is not None:
            from trainer.models.streamed_load import SafetensorsReader, load_streamed

            keys = [k for k in self.keys if k.startswith(prefix) and not k.startswith(EMA_PREFIX)]
            try:
                module = load_streamed(SafetensorsReader(self.path), keys, build, storage)
            except NotStreamable:
                return build(self.take(prefix))
            taken = set(keys)
            self.keys = [k for k in self.keys if k not in taken]
            return module
        return build(self.take(prefix))

    def close(self) -> None:
        self._handle = None
        self._tensors = {}

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _torch_load(path: Path) -> Any:
    """``torch.load`` of tensors only; memory-mapped when the file's format allows."""
    try:
        try:
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # the legacy (pre-zip) format cannot be mapped
            if "mmap" not in str(exc) and "zip" not in str(exc):
                raise
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise ModelLoadError(
            f"{path}: this .ckpt needs more than tensors to unpickle{what}, and unpickling "
            f"that could run any code, so the studio reads .ckpt files with "
            f"torch.load(weights_only=True) only. Convert it to .safetensors with a tool you "
            f"trust it to, or use the .safetensors release of the model") from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise ModelLoadError(f"{path}: not a readable .ckpt file ({exc})") from None


def inspect(ckpt: Checkpoint) -> Detected:
    """The family and facts of an open checkpoint, from its header."""
    return detect(ckpt.keys, ckpt.shape)


def unet_dtype(ckpt: Checkpoint) -> Optional[str]:
    keys = [k for k in ckpt.keys if k.startswith(UNET_PREFIX) and k.endswith(".weight")]
    return ckpt.dtype(keys[0]) if keys else None


def _check_complete(module: torch.nn.Module, component: str) -> torch.nn.Module:
    """diffusers leaves weights that the file lacks on the meta device; name them."""
    missing = [n for n, t in [*module.named_parameters(), *module.named_buffers()]
               if t.device.type == "meta"]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise ModelLoadError(f"the file lacks {len(missing)} weights of the {component} "
                             f"({shown}); it does not match the configs it is loaded with")
    return module


def load_diffusers_part(model_class: Any, tensors: dict[str, torch.Tensor], config_dir: Path,
                        component: str) -> torch.nn.Module:
    """A UNet or VAE from its original-layout tensors and the config in ``config_dir``."""
    try:
        module = model_class.from_single_file(
            tensors, config=str(config_dir), subfolder=component, local_files_only=True)
    except NotStreamable:
        raise
    except Exception as exc:  # noqa: BLE001 - shape mismatches, missing configs, ...
        raise ModelLoadError(f"cannot build the {component} from the file with the configs "
                             f"in {config_dir} ({exc})") from None
    return _check_complete(module, component)


def load_text_encoder(slot: TextEncoderSlot, tensors: dict[str, torch.Tensor],
                      config_dir: Path) -> torch.nn.Module:
    import transformers
    from diffusers.loaders.single_file_utils import create_diffusers_clip_model_from_ldm

    model_class = getattr(transformers, slot.model_class)
    try:
        module = create_diffusers_clip_model_from_ldm(
            model_class, checkpoint=tensors, subfolder=slot.component, config=str(config_dir),
            local_files_only=True)
    except NotStreamable:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot build the {slot.component} from the file with the "
                             f"configs in {config_dir} ({exc})") from None
    return _check_complete(module, slot.component)


def load_unet(ckpt: Checkpoint, config_dir: Path, fp8: Optional[torch.dtype] = None
              ) -> torch.nn.Module:
    """The UNet, in fp32; with ``fp8`` (the compute dtype of a run with model.base_precision =
    "fp8") frozen, and the weights that fp8 storage holds stream from the file into fp8 (an
    fp8 file's as they are, others by way of ``fp8``), the rest in ``fp8``: the UNet is never
    held at full width (an SDXL UNet: 2.6 GB in fp8, 10.3 GB in fp32). A ``.ckpt`` is built
    whole, then stored."""
    from diffusers import UNet2DConditionModel

    from trainer.models.memory import fp8_storage, store_fp8, to_compute_dtype

    unet = ckpt.load_part(UNET_PREFIX, lambda t: load_diffusers_part(
        UNet2DConditionModel, t, config_dir, "unet"), None if fp8 is None else fp8_storage(fp8))
    if fp8 is not None:
        to_compute_dtype(unet, fp8)  # what is not stored: as MemoryPlan.begin casts it
        store_fp8(unet.requires_grad_(False), fp8)  # the compute copies' hooks
    return unet


def fp8_unet(section: Any, dtype: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """The dtype that a UNet stored in fp8 at the load computes in (model.base_precision =
    "fp8" with the run's compute dtype, fp32 without one), or None."""
    return (dtype or torch.float32) if section.base_precision == "fp8" else None


def load_modules(ckpt: Checkpoint, found: Detected, config_dir: Path, with_vae: bool = True,
                 fp8: Optional[torch.dtype] = None) -> dict[str, Any]:
    """UNet (``fp8``: see :func:`load_unet`), VAE (when the file has one and it is wanted) and
    text encoder(s), in turn."""
    from diffusers import AutoencoderKL

    parts: dict[str, Any] = {"unet": load_unet(ckpt, config_dir, fp8)}
    if found.has_vae and with_vae:
        parts["vae"] = ckpt.load_part(VAE_PREFIX, lambda t: load_diffusers_part(
            AutoencoderKL, t, config_dir, "vae"))
    for slot in found.family.encoders:
        parts[slot.component] = ckpt.load_part(
            slot.prefix, lambda t, slot=slot: load_text_encoder(slot, t, config_dir))
    return parts


def load_vae_file(path: Path, config_dir: Path) -> torch.nn.Module:
    """A VAE file (``model.vae``): original layout with or without ``first_stage_model.``."""
    from diffusers import AutoencoderKL

    with Checkpoint(path) as ckpt:
        prefix = VAE_PREFIX if any(k.startswith(VAE_PREFIX) for k in ckpt.keys) else ""
        return load_diffusers_part(AutoencoderKL, ckpt.take(prefix), config_dir, "vae")
