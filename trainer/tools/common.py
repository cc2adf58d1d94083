"""What the tools share: the progress callback, precisions, loading models by path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

# done, total, what is being done: the CLI draws a tqdm bar, the GUI gradio's progress
Progress = Callable[[int, int, str], None]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def no_progress(done: int, total: int, what: str) -> None:
    return None


class ToolError(ValueError):
    """A tool cannot do what it was asked; the message says why, for people."""


def existing_file(path: str | Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ToolError(f"{what} {str(path)!r}: no such file")
    if path.suffix.lower() != ".safetensors":
        raise ToolError(f"{what} {str(path)!r}: only .safetensors files are read (a .ckpt or "
                        f".pt file can run code when loaded)")
    return path


def load_model(path: str | Path, config_dir: Optional[str] = None) -> Any:
    """A base model (diffusers folder or single file) through the trainer's loader.
    ``config_dir`` (a diffusers folder) gives a single file its configs, and its tokenizer
    when it has one."""
    from trainer.config import ModelSection
    from trainer.models.loader import ModelLoadError, load_base_model
    from trainer.system.library_lock import library_imports

    tokenizer = None
    if config_dir and (Path(config_dir).expanduser() / "tokenizer").is_dir():
        tokenizer = config_dir
    section = ModelSection(pretrained_model_name_or_path=str(path), config_dir=config_dir,
                           tokenizer=tokenizer)
    try:
        with library_imports():  # the GUI may start a run or an estimate meanwhile
            return load_base_model(section)
    except ModelLoadError as exc:
        raise ToolError(str(exc)) from None


def text_encoders(model: Any) -> list[tuple[str, Any]]:
    """(attribute name, module) of the model's text encoders."""
    names = ("text_encoder", "text_encoder_2")
    return [(n, getattr(model, n)) for n in names if getattr(model, n, None) is not None]


def native_size(model: Any) -> int:
    """The model's native image size: the UNet's sample size times the VAE's downscale."""
    return model.denoiser.config.sample_size * 2 ** (len(model.vae.config.block_out_channels) - 1)


def model_modelspec(model: Any, title: str, adapter: Optional[str]) -> dict[str, str]:
    """``modelspec.*`` (sai_model_spec 1.0.1) of a file made from ``model``: a checkpoint
    (``adapter=None``) or a LoRA (``"lora"``), filled as :mod:`trainer.export.metadata` does."""
    import datetime

    from trainer.export.metadata import (
        IMPL_DIFFUSERS,
        IMPL_STABILITY_AI,
        SPEC_VERSION,
        modelspec_architecture,
    )
    from trainer.families import role

    v_pred = model.prediction_type == "v_prediction"
    sgm = adapter is None or role(model.version, "targets").SGM_NAMES
    size = native_size(model)
    return {
        "modelspec.sai_model_spec": SPEC_VERSION,
        "modelspec.architecture": modelspec_architecture(model.version, v_pred, adapter),
        "modelspec.implementation": IMPL_STABILITY_AI if sgm else IMPL_DIFFUSERS,
        "modelspec.title": title,
        "modelspec.resolution": f"{size}x{size}",
        "modelspec.date": datetime.datetime.now().replace(microsecond=0).isoformat(),
        "modelspec.prediction_type": "v" if v_pred else "epsilon",
    }
