"""Load a FLUX.1 / SD 3.x single file (and its separate part files) offline into diffusers modules.

The result has the component names of diffusers' ``FluxPipeline`` / ``StableDiffusion3Pipeline``
(``transformer``, ``vae``, ``text_encoder``, ``text_encoder_2``, ``text_encoder_3``, the
tokenizers, ``scheduler``), so a FLUX.1 file and a diffusers folder end in the same modules.

- **Which file holds what**: :mod:`trainer.models.flow_families` reads the header. A part
  that the file lacks comes from its setting (``model.ae``, ``model.clip_l``, ``model.clip_g``,
  ``model.t5xxl``, sd-scripts' names); a setting also replaces a part that the file holds. A
  part in neither is one error that names every missing setting and the file to point it at.
- **Conversion** is diffusers' own: ``FluxTransformer2DModel`` / ``SD3Transformer2DModel`` /
  ``AutoencoderKL.from_single_file(tensors, config=<folder>, local_files_only=True)``. One
  exception: diffusers 0.42's FLUX converter splits ``single_blocks.N.linear1`` with FLUX.1's
  fixed width (3072), so for another width (a test model) this module splits ``linear1`` by
  the header's width and lets diffusers convert the rest. The text encoders are transformers'
  own names in every known file (``text_model.*``, ``encoder.block.*``): built on the meta
  device from their config and filled with diffusers' ``load_model_dict_into_meta``. SD 3's
  CLIP-L gets an identity ``text_projection``, as diffusers' reader gives it (SD 3 pools CLIP-L
  without projection; ComfyUI likewise).
- **Configs**: ``config_dir`` (a folder of diffusers component configs, ``model.config_dir``)
  first, per component; else the family's shipped configs (``trainer/assets/families/``); a
  transformer whose header is not the published size gets the header's shapes
  (``FlowFileInfo.transformer_config``), FLUX's rotary axes from its head width.
- **Memory**: the transformer streams from the file tensor by tensor into its meta-built
  modules (trainer/models/streamed_load.py), in ``dtype``, or with ``fp8_transformer`` into
  fp8 storage as the tensors arrive; each other component's tensors are read when it is built
  and dropped before the next (the file is never held twice). fp8 (``float8_e4m3fn``) weights
  are upcast to ``dtype`` as they are read, but for those that fp8 storage keeps.
- **No network**: configs are local files, tokenizers come from
  :mod:`trainer.models.flow_tokenizers`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.models.families import ModelLoadError
from trainer.models.flow_families import (
    REQUIRED,
    TEXT_MARKERS,
    TEXT_PREFIXES,
    VAE_PREFIXES,
    FlowFileInfo,
    detect_flow,
    shipped_config,
)
from trainer.models.flow_tokenizers import load_flow_tokenizers

FLUX_WIDTH = 3072  # the width diffusers' FLUX converter assumes
FLUX_ROPE = {128: [16, 56, 56]}  # head width -> rotary axes (FLUX.1's)
COMPONENTS = {"flux": {"clip_l": "text_encoder", "t5xxl": "text_encoder_2"},
              "sd3": {"clip_l": "text_encoder", "clip_g": "text_encoder_2",
                      "t5xxl": "text_encoder_3"}}
WHERE = {"vae": "model.ae", "clip_l": "model.clip_l", "clip_g": "model.clip_g",
         "t5xxl": "model.t5xxl"}
FILES = {"vae": "the family's VAE (ae.safetensors of black-forest-labs/FLUX.1-schnell or -dev; "
                "SD 3.5's vae/diffusion_pytorch_model.safetensors)",
         "clip_l": "clip_l.safetensors (comfyanonymous/flux_text_encoders, or SD 3.5's "
                   "text_encoders/)",
         "clip_g": "clip_g.safetensors (SD 3.5's text_encoders/)",
         "t5xxl": "t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn.safetensors "
                  "(comfyanonymous/flux_text_encoders, or SD 3.5's text_encoders/)"}
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


def _complete(module: torch.nn.Module, what: str, where: str) -> torch.nn.Module:
    """Weights that no tensor filled stay on the meta device: name them."""
    missing = [n for n, t in [*module.named_parameters(), *module.named_buffers()]
               if t.device.type == "meta"]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                          else "")
        raise ModelLoadError(f"{where}: the {what} lacks {len(missing)} weights ({shown}); the "
                             f"file does not match the configs it is loaded with")
    return module.eval()


def _fail(where: str, what: str, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"{where}: cannot build the {what} ({exc}). If the file is not the "
                          f"published size, set model.config_dir to a folder of diffusers "
                          f"configs of its shape ({what}/config.json)")


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
    config = {**shipped_config(info.family), **info.transformer_config}
    if info.kind == "flux":
        rope = FLUX_ROPE.get(config["attention_head_dim"])
        if rope is None:
            raise ModelLoadError(f"its FLUX.1 transformer has heads {config['attention_head_dim']} "
                                 f"wide (FLUX.1: 128), so its rotary axes are unknown; set "
                                 f"model.config_dir to a folder with transformer/config.json")
        config["axes_dims_rope"] = rope
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flow-config-")))
    (root / "transformer").mkdir()
    (root / "transformer" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


# --- components -------------------------------------------------------------------------------


def _flux_linear1(tensors: dict[str, torch.Tensor], info: FlowFileInfo) -> dict[str, Any]:
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


def _transformer(weights: Weights, info: FlowFileInfo, root: Path, dtype: torch.dtype,
                 fp8: bool = False):
    """The transformer, streamed from the file tensor by tensor into its modules
    (trainer/models/streamed_load.py); with ``fp8`` (model.base_precision = "fp8") every layer
    that fp8 storage holds is stored in fp8 as its tensors arrive, so the whole transformer is
    never held in ``dtype`` (FLUX.1-dev: 11.9 GB in fp8, 23.8 GB in bf16)."""
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

    def build(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
        tensors = {k[len(prefix):]: v for k, v in tensors.items()}
        return cls.from_single_file(_flux_linear1(tensors, info) if split else tensors,
                                    config=str(root), subfolder="transformer",
                                    local_files_only=True, torch_dtype=dtype)

    try:
        try:
            module = load_streamed(SafetensorsReader(weights.path), keys, build,
                                   _fp8_as_filled(dtype) if fp8 else None)
        except NotStreamable:
            module = build(weights.take(prefix, dtype, exclude=others if not prefix else ()))
    except Exception as exc:  # noqa: BLE001 - shape mismatches, missing keys, ...
        raise _fail(where, "transformer", exc) from None
    module = _complete(module, "transformer", where)
    if fp8:
        from trainer.models.memory import store_fp8

        store_fp8(module.requires_grad_(False), dtype)  # the hooks; cast what is not yet
    return module


def _fp8_as_filled(dtype: torch.dtype) -> Any:
    """``after`` for :func:`load_streamed`: each group's weights that fp8 storage holds are cast
    to fp8 as soon as they are filled (one group at most is held in ``dtype``)."""
    from trainer.models.memory import FP8, fp8_layers

    stored: set[str] = set()
    seen: list[bool] = []

    def after(model: torch.nn.Module, names: list[str]) -> None:
        if not seen:
            seen.append(True)
            stored.update(f"{layer}.{name}" for layer, module in fp8_layers(model)
                          for name, _ in module.named_parameters(recurse=False))
        for name in names:
            if name in stored:
                param = model.get_parameter(name)
                param.data = param.data.to(FP8)

    return after


def _vae(weights: Weights, prefix: str, root: Path, dtype: torch.dtype):
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
        raise _fail(where, "vae", exc) from None
    return _complete(module, "vae", where)


def _text_prefix(weights: Weights, encoder: str) -> str:
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


def _text_encoder(weights: Weights, prefix: str, encoder: str, info: FlowFileInfo, root: Path,
                  dtype: torch.dtype):
    import transformers
    from accelerate import init_empty_weights
    from diffusers.models.model_loading_utils import load_model_dict_into_meta

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
    tensors = _text_state(weights.take(prefix, dtype), model, encoder, identity)
    wanted = set(model.state_dict())
    try:
        load_model_dict_into_meta(model, {k: v for k, v in tensors.items() if k in wanted},
                                  dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        raise _fail(where, component, exc) from None
    if encoder == "t5xxl":
        model.encoder.set_input_embeddings(model.shared)
    return _complete(model.to(dtype), component, where)


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


def load_flow_components(transformer_file: str | Path, *, ae: Optional[str] = None,
                         clip_l: Optional[str] = None, clip_g: Optional[str] = None,
                         t5xxl: Optional[str] = None, config_dir: Optional[str] = None,
                         tokenizer: Optional[str] = None,
                         dtype: torch.dtype = torch.float32,
                         fp8_transformer: bool = False) -> dict[str, Any]:
    """The pipeline components of a FLUX.1 / SD 3.x single file; see the module's notes.

    ``ae``/``clip_l``/``clip_g``/``t5xxl`` are the settings ``model.ae`` ... (paths or None),
    ``config_dir`` ``model.config_dir``, ``tokenizer`` ``model.tokenizer``; ``dtype`` the
    dtype the modules are built in (fp8 files are upcast to it); ``fp8_transformer``
    (model.base_precision = "fp8") loads the frozen transformer into fp8 storage instead.
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
        root = _transformer_root(info, conf, stack)
        parts["transformer"] = _transformer(main, info, root, dtype, fp8_transformer)
        weights, prefix = sources.pop("vae")
        parts["vae"] = _vae(weights, _vae_prefix(weights) if prefix is None else prefix,
                            _config_root(conf, "vae", info), dtype)
        for encoder, (weights, prefix) in sources.items():
            component = COMPONENTS[info.kind][encoder]
            found = _text_prefix(weights, encoder) if prefix is None else prefix
            parts[component] = _text_encoder(weights, found, encoder, info,
                                             _config_root(conf, component, info), dtype)
    scheduler_root = info.config_dir()
    if conf and (conf / "scheduler" / "scheduler_config.json").is_file():
        scheduler_root = conf
    parts["scheduler"] = FlowMatchEulerDiscreteScheduler.from_pretrained(
        str(scheduler_root), subfolder="scheduler", local_files_only=True)
    return parts
