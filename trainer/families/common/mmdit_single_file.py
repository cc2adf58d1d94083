"""Load a FLUX.1 / SD 3.x single file (and its separate part files) offline into diffusers modules.

The result has the component names of diffusers' ``FluxPipeline`` / ``StableDiffusion3Pipeline``
(``transformer``, ``vae``, ``text_encoder``, ``text_encoder_2``, ``text_encoder_3``, the
tokenizers, ``scheduler``), so a FLUX.1 file and a diffusers folder end in the same modules.

- **Which file holds what**: :mod:`trainer.families.common.mmdit_detect` reads the header. A part
  that the file lacks comes from its setting (``model.ae``, ``model.clip_l``, ``model.clip_g``,
  ``model.t5xxl``, sd-scripts' names); a setting also replaces a part that the file holds. A
  part in neither is one error that names every missing setting and the file to point it at.
- **Each part** is built by :mod:`trainer.families.common.mmdit_parts` (diffusers' converters, the
  text encoders filled on the meta device).
- **Configs**: ``config_dir`` (a folder of diffusers component configs, ``model.config_dir``)
  first, per component; else the family's shipped configs (``trainer/assets/families/``); a
  transformer whose header is not the published size gets the header's shapes
  (``FlowFileInfo.transformer_config``), FLUX's rotary axes from its head width.
- **Memory**: the transformer streams from the file into its modules, in ``dtype`` or, with
  ``fp8_transformer``, into fp8 storage as its tensors arrive (with ``quantize_transformer``,
  into bitsandbytes' NF4 / int8 layers); the text encoders fill a group
  of tensors at a time (T5 into fp8 with ``fp8_t5``); the file is never held twice. Other fp8
  (``float8_e4m3fn``) weights are upcast to ``dtype`` as they are read.
- **No network**: configs are local files, tokenizers come from
  :mod:`trainer.families.common.mmdit_tokenizers`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.common.mmdit_detect import (
    FILES,
    REQUIRED,
    VAE_PREFIXES,
    WHERE,
    FlowFileInfo,
    detect_flow,
    header_config,
)
from trainer.families.common.mmdit_parts import (
    COMPONENTS,
    Weights,
    build_text_encoder,
    build_transformer,
    build_vae,
    text_prefix,
)
from trainer.families.common.mmdit_tokenizers import load_flow_tokenizers
from trainer.families.spec import ModelLoadError

# --- configs ----------------------------------------------------------------------------------


def _config_root(config_dir: Optional[Path], component: str, info: FlowFileInfo) -> Path:
    if config_dir and (config_dir / component / "config.json").is_file():
        return config_dir
    return info.config_dir()


def _check_fits(info: FlowFileInfo, config_file: Path) -> None:
    """model.config_dir's transformer config must have the header's shapes."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("out_channels") is None:
        config["out_channels"] = config.get("in_channels")
    wrong = [f"{k} {config[k]!r} (the file: {v!r})" for k, v in info.transformer_config.items()
             if k in config and (list(config[k]) if isinstance(config[k], tuple) else
                                 config[k]) != v]
    if wrong:
        raise ModelLoadError(f"model.config_dir = {str(config_file.parent.parent)!r}: its "
                             f"transformer/config.json does not fit the file: {', '.join(wrong)}")


def _transformer_root(info: FlowFileInfo, config_dir: Optional[Path], stack: ExitStack) -> Path:
    """A folder with ``transformer/config.json``: model.config_dir's, the shipped one, or one
    written now from the header's shapes."""
    if config_dir and (config_dir / "transformer" / "config.json").is_file():
        _check_fits(info, config_dir / "transformer" / "config.json")
        return config_dir
    if info.published_size:
        return info.config_dir()
    config = header_config(info)
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flow-config-")))
    (root / "transformer").mkdir()
    (root / "transformer" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


# --- components -------------------------------------------------------------------------------


# --- the entry point --------------------------------------------------------------------------


def _sources(info: FlowFileInfo, main: Weights, settings: dict[str, Optional[str]]
             ) -> dict[str, tuple[Weights, Optional[str]]]:
    """part -> (open file, prefix or None to find); one error naming every missing setting."""
    out, missing = {}, []
    for part in REQUIRED[info.kind][1:]:
        if settings.get(part):
            out[part] = (Weights(Path(settings[part]).expanduser(), WHERE[part]), None)
        elif part in info.prefixes:
            out[part] = (main, info.prefixes[part])
        else:
            missing.append(part)
    if missing:
        lines = "; ".join(f"set {WHERE[p]} to {FILES[p]}" for p in missing)
        raise ModelLoadError(f"model.pretrained_model_name_or_path = {str(main.path)!r} is "
                             f"{info.label} and holds no {', '.join(missing)}: {lines}")
    return out


def _vae_prefix(weights: Weights) -> str:
    for prefix in VAE_PREFIXES:
        if any(k.startswith(prefix + "decoder.") for k in weights.keys):
            return prefix
    return ""


def _transformer_later(path: Path, info: FlowFileInfo, conf: Optional[Path], fp8: bool,
                       quantized: Optional[str] = None) -> Callable[[torch.dtype], Any]:
    """``build(dtype)``: the file's transformer (see :func:`build_transformer`)."""

    def build(dtype: torch.dtype) -> Any:
        with ExitStack() as stack:
            main = Weights(path, "model.pretrained_model_name_or_path")
            return build_transformer(main, info, _transformer_root(info, conf, stack), dtype, fp8,
                                     quantized)

    return build


def load_flow_components(transformer_file: str | Path, *, ae: Optional[str] = None,
                         clip_l: Optional[str] = None, clip_g: Optional[str] = None,
                         t5xxl: Optional[str] = None, config_dir: Optional[str] = None,
                         tokenizer: Optional[str] = None,
                         dtype: torch.dtype = torch.float32,
                         fp8_transformer: bool = False, fp8_t5: bool = False,
                         quantize_transformer: Optional[str] = None,
                         defer_transformer: bool = False) -> dict[str, Any]:
    """The pipeline components of a FLUX.1 / SD 3.x single file; see the module's notes.

    ``ae``/``clip_l``/``clip_g``/``t5xxl`` are the settings ``model.ae`` ... (paths or None),
    ``config_dir`` ``model.config_dir``, ``tokenizer`` ``model.tokenizer``; ``dtype`` the
    dtype the modules are built in (fp8 files are upcast to it); ``fp8_transformer``
    (model.base_precision = "fp8") and ``fp8_t5`` (model.fp8_text_encoders, T5 not trained)
    load the frozen transformer and T5 into fp8 storage instead; ``quantize_transformer``
    ("nf4" / "int8", model.base_precision) quantizes the transformer's Linear layers as their
    weights arrive (trainer/models/quantize.py). ``defer_transformer``: the
    transformer is not built now: ``transformer`` is None and ``build_transformer(dtype)``
    builds it from the file later (so that T5 can be used and let go first).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    path = Path(transformer_file).expanduser()
    conf = Path(config_dir).expanduser() if config_dir else None
    with ExitStack() as stack:
        main = Weights(path, "model.pretrained_model_name_or_path")
        try:
            info = detect_flow(main.keys, main.shape, main.dtype)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{main.setting} = {str(path)!r}: {exc}") from None
        settings = {"vae": ae, "clip_l": clip_l, "clip_g": clip_g, "t5xxl": t5xxl}
        sources = _sources(info, main, settings)
        parts: dict[str, Any] = load_flow_tokenizers(info.family, tokenizer, path)
        _transformer_root(info, conf, stack)  # a config it cannot build fails now
        later = _transformer_later(path, info, conf, fp8_transformer, quantize_transformer)
        parts["transformer"] = None if defer_transformer else later(dtype)
        if defer_transformer:
            parts["build_transformer"] = later
        weights, prefix = sources.pop("vae")
        parts["vae"] = build_vae(weights, _vae_prefix(weights) if prefix is None else prefix,
                                 _config_root(conf, "vae", info), dtype)
        for encoder, (weights, prefix) in sources.items():
            component = COMPONENTS[info.kind][encoder]
            found = text_prefix(weights, encoder) if prefix is None else prefix
            parts[component] = build_text_encoder(weights, found, encoder, info,
                                                  _config_root(conf, component, info), dtype,
                                                  fp8_t5 and encoder == "t5xxl")
    scheduler_root = info.config_dir()
    if conf and (conf / "scheduler" / "scheduler_config.json").is_file():
        scheduler_root = conf
    parts["scheduler"] = FlowMatchEulerDiscreteScheduler.from_pretrained(
        str(scheduler_root), subfolder="scheduler", local_files_only=True)
    return parts
