"""Load Qwen-Image from the split files as ComfyUI users download them, offline: the diffusion
model (``qwen_image_bf16.safetensors``, an fp8 one, or an all-in-one checkpoint), the text
encoder file (``qwen_2.5_vl_7b.safetensors``; setting ``model.text_encoder``) and the VAE file
(``qwen_image_vae.safetensors``; setting ``model.vae``); musubi-tuner's ``--dit``,
``--text_encoder``, ``--vae``. A part the file holds is read from it unless its setting names
another file.

- **Transformer**: streamed from the file into a meta-built ``QwenImageTransformer2DModel``
  (:func:`trainer.models.streamed_load.load_streamed`; diffusers' single-file map is the
  identity) in the run's ``dtype``; with ``model.base_precision = "fp8"`` its Linear weights go
  into fp8 storage as they arrive. Configs: ``model.config_dir``'s, else the shipped ones
  (``trainer/assets/families/qwen-image``); a file of another size needs ``model.config_dir``.
- **VAE**: the Wan 2.1 layout, renamed by :func:`~trainer.families.qwen_image.layout
  .wan_vae_name` (the inverse of diffusers' ``convert_wan_vae_to_diffusers``).
- **Text encoder**: Qwen2.5-VL in its checkpoint's names, built on the meta device and filled a
  group of tensors at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.families.common.mmdit_parts import Weights, complete, fail
from trainer.families.qwen_image.detect import EDIT_2511, LABELS, QwenFileInfo
from trainer.families.qwen_image.layout import TEXT, VAE, wan_vae_name
from trainer.families.spec import ASSETS, ModelLoadError

FIELD = "model.pretrained_model_name_or_path"
SHIPPED = ASSETS / "qwen-image"
PUBLISHED = {"layers": 60, "width": 3072, "text_width": 3584}
FILES = {"vae": "qwen_image_vae.safetensors (Comfy-Org/Qwen-Image_ComfyUI, split_files/vae)",
         "text_encoder": "qwen_2.5_vl_7b.safetensors (Comfy-Org/Qwen-Image_ComfyUI, "
                         "split_files/text_encoders)"}
SETTINGS = {"vae": "model.vae", "text_encoder": "model.text_encoder"}
TEXT_MARKER = "model.layers.0.self_attn.k_proj.bias"
# what fp8 text-encoder storage leaves in the compute precision: the norms, the embeddings, the
# output head and the vision tower (Qwen-Image reads the language model's hidden states only)
TEXT_SKIP = ("norm", "embed", "lm_head", "visual")


def config_root(config_dir: Optional[str], component: str) -> Path:
    """``model.config_dir`` where it has the component's config, else the shipped configs."""
    if config_dir:
        root = Path(config_dir).expanduser()
        if (root / component / "config.json").is_file():
            return root
    return SHIPPED


def _transformer_root(info: QwenFileInfo, config_dir: Optional[str], path: Path) -> Path:
    root = config_root(config_dir, "transformer")
    config = json.loads((root / "transformer" / "config.json").read_text(encoding="utf-8"))
    found = {"layers": config["num_layers"], "text_width": config["joint_attention_dim"],
             "width": config["num_attention_heads"] * config["attention_head_dim"]}
    wrong = [f"{k} {found[k]} (the file: {getattr(info, k)})" for k in found
             if found[k] != getattr(info, k)]
    if wrong:
        where = "model.config_dir" if root != SHIPPED else "the shipped Qwen-Image configs"
        raise ModelLoadError(f"{FIELD} = {str(path)!r} is not the published Qwen-Image size "
                             f"for {where}: {', '.join(wrong)}; set model.config_dir to a folder "
                             f"of diffusers configs of its shape (transformer/config.json)")
    return root


def build_transformer(path: Path, info: QwenFileInfo, root: Path, dtype: torch.dtype,
                      fp8: bool = False, variant: Optional[str] = None) -> Any:
    """The transformer, streamed from the file (see the module's notes) as ``variant`` (the
    header's unless model.model_version names one)."""
    from diffusers import QwenImageTransformer2DModel

    from trainer.families.common.comfy_quant import ComfyQuantReader
    from trainer.models.memory import fp8_storage
    from trainer.models.streamed_load import load_streamed

    reader = ComfyQuantReader(path, dtype)  # ComfyUI's scaled fp8 read as fp8 * scale
    keys = [k for k in reader.entries if k.startswith(info.prefix)
            and not (not info.prefix and k.startswith((VAE, TEXT)))
            and k != info.prefix + EDIT_2511]  # ComfyUI's marker, no weight
    # 2511 gives its reference tokens the zero timestep (diffusers' zero_cond_t)
    extra = {"zero_cond_t": True} if (variant or info.variant) == "edit-2511" else {}
    where = f"{FIELD} = {str(path)!r}"
    storage = fp8_storage(dtype) if fp8 else None

    def build(tensors: dict[str, torch.Tensor]) -> Any:
        tensors = {k[len(info.prefix):]: v for k, v in tensors.items()}
        return QwenImageTransformer2DModel.from_single_file(
            tensors, config=str(root), subfolder="transformer", local_files_only=True,
            torch_dtype=dtype if storage is None else None, **extra)

    try:
        module = load_streamed(reader, keys, build, storage, dtype)
    except Exception as exc:  # noqa: BLE001 - shape mismatches, missing keys, ...
        raise fail(where, "transformer", exc) from None
    module = complete(module, "transformer", where)
    if fp8:
        from trainer.models.memory import store_fp8, to_compute_dtype

        to_compute_dtype(module, dtype)
        store_fp8(module.requires_grad_(False), dtype)
    return module


def _prefix(weights: Weights, marker: str, prefixes: tuple[str, ...], part: str) -> str:
    for prefix in prefixes:
        if prefix + marker in weights.keys:
            return prefix
    raise ModelLoadError(f"{weights.setting} = {str(weights.path)!r}: no Qwen-Image {part} "
                         f"in it ({marker}); point it at {FILES[part]}")


def build_vae(weights: Weights, root: Path, dtype: torch.dtype) -> Any:
    """The VAE from its Wan 2.1 names (bare, ``vae.``)."""
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKLQwenImage

    from trainer.families.common.comfy_quant import ComfyQuantReader

    prefix = _prefix(weights, "decoder.conv1.weight", ("", VAE), "vae")
    with init_empty_weights():
        model = AutoencoderKLQwenImage.from_config(
            AutoencoderKLQwenImage.load_config(str(root), subfolder="vae"))
    names = {prefix + wan_vae_name(k, model.config.num_res_blocks): k
             for k in model.state_dict()}
    where = f"{weights.setting} = {str(weights.path)!r}"
    reader = ComfyQuantReader(weights.path, dtype)
    try:
        state = {ours: reader.read(theirs).to(dtype) for theirs, ours in names.items()
                 if theirs in reader.entries}
        model.load_state_dict(state, strict=False, assign=True)
    except Exception as exc:  # noqa: BLE001
        raise fail(where, "vae", exc) from None
    return complete(model, "vae", where)


def build_text_encoder(weights: Weights, root: Path, dtype: torch.dtype,
                       fp8: bool = False) -> Any:
    """Qwen2.5-VL from its checkpoint's names (bare, or under ComfyUI's prefix); with ``fp8``
    (model.fp8_text_encoders) its Linear weights go into fp8 storage as they arrive."""
    from accelerate import init_empty_weights
    from diffusers.models.model_loading_utils import load_model_dict_into_meta
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.core_model_loading import revert_weight_conversion

    from trainer.families.common.comfy_quant import ComfyQuantReader
    from trainer.families.common.mmdit_parts import _groups
    from trainer.models.memory import fp8_storage, store_fp8, to_compute_dtype
    from trainer.models.streamed_load import fill

    prefix = _prefix(weights, TEXT_MARKER, ("", TEXT), "text_encoder")
    with init_empty_weights():
        model = Qwen2_5_VLForConditionalGeneration(
            Qwen2_5_VLConfig.from_pretrained(str(root / "text_encoder")))
    state = model.state_dict(keep_vars=True)
    ours = {id(t): k for k, t in state.items()}  # the renaming keeps each tensor
    names = {theirs: ours[id(t)] for theirs, t in revert_weight_conversion(model, state).items()}
    where = f"{weights.setting} = {str(weights.path)!r}"
    reader = ComfyQuantReader(weights.path, dtype)  # qwen_2.5_vl_7b_fp8_scaled: fp8 * scale
    wanted = [(ours, prefix + theirs) for theirs, ours in names.items()
              if prefix + theirs in reader.entries]
    storage = fp8_storage(dtype, TEXT_SKIP)
    stored = storage.select(model) if fp8 else set()
    try:
        for group in _groups(weights, wanted):
            fill(model, {n: reader.read(k) for n, k in group}, stored, storage,
                 load_model_dict_into_meta, dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        raise fail(where, "text_encoder", exc) from None
    if model.config.tie_word_embeddings:
        model.tie_weights()
    to_compute_dtype(model, dtype)
    model = complete(model, "text_encoder", where)
    if fp8:
        store_fp8(model.requires_grad_(False), dtype, TEXT_SKIP)
    return model


def refuse_variant(path: Path, variant: str) -> None:
    """A clear refusal of the variants that do not train (Layered)."""
    if variant == "layered":
        raise ModelLoadError(f"{FIELD} = {str(path)!r} is {LABELS[variant]}: training the "
                             f"Qwen-Image layered variant is not supported yet; use "
                             f"Qwen-Image, Qwen-Image-2512 or an edit model")


def processor_fields(variant: str, section: Any, tokenizer: Any,
                     files: list[Path]) -> dict[str, Any]:
    """An edit file's processor (none ships in a ComfyUI file), looked up as its tokenizer is
    (:mod:`trainer.families.common.qwen_processor`: the settings, beside ``files``, the
    Hugging Face cache, else the shipped copy)."""
    from trainer.families.common.qwen_processor import locate
    from trainer.families.qwen_image.edit import is_edit, load_processor

    if not is_edit(variant):
        return {}
    found = locate(section.tokenizer, section.config_dir, files)
    return {"processor": load_processor(found.folder, tokenizer, found.where)}


def check_version(path: Path, section: Any, what: str) -> None:
    """model.model_version names Qwen-Image (or one of its variants) or nothing."""
    from trainer.families import version_family

    if version_family(section.model_version) not in ("auto", "qwen_image"):
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                             f"{section.model_version!r}, but it holds {what}; set it to "
                             f"'auto' or 'qwen_image'")


def file_variant(path: Path, section: Any, info: QwenFileInfo) -> str:
    """The variant a single file loads as: the header's, or the edit variant that
    model.model_version names for a file with Qwen-Image's keys (Edit and 2509 files have the
    base model's; a 2511 file says so itself)."""
    from trainer.families import version_variant

    check_version(path, section, info.description)
    named = version_variant(section.model_version)
    if named is None or named == info.variant:
        return info.variant
    if info.variant == "base" and named != "edit-2511":
        return named
    why = (f"a Qwen-Image-Edit-2511 file carries ComfyUI's {EDIT_2511} key, and this one has "
           f"none: it is Qwen-Image, -Edit or -Edit-2509; set it to 'qwen_image_edit' or "
           f"'qwen_image_edit_2509', or 'auto'" if info.variant == "base" else
           "set it to 'auto' or 'qwen_image'")
    raise ModelLoadError(f"{FIELD} = {str(path)!r}: model.model_version = "
                         f"{section.model_version!r} ({LABELS[named]}), but the file is "
                         f"{info.description}; {why}")


def described(variant: str, info: QwenFileInfo) -> str:
    """The log's description of a file loaded as ``variant`` (the header's facts)."""
    if variant == info.variant:
        return info.description
    return f"{LABELS[variant]}, by model.model_version ({info.description})"


def _source(part: str, info: QwenFileInfo, main: Weights, section: Any) -> Weights:
    """The file a part comes from: its setting's, else the main file if it holds the part."""
    setting = getattr(section, part, None)
    if setting:
        return Weights(Path(setting).expanduser(), SETTINGS[part])
    if {"vae": "vae", "text_encoder": "qwen25_7b"}[part] in info.parts:
        return main
    raise ModelLoadError(f"{FIELD} = {str(main.path)!r} is {info.label}'s diffusion model and "
                         f"holds no {part.replace('_', ' ')}: set {SETTINGS[part]} to "
                         f"{FILES[part]}")


def file_info(path: Path) -> QwenFileInfo:
    from trainer.families.common.files import read_safetensors_header
    from trainer.families.qwen_image.detect import from_header

    found = from_header(read_safetensors_header(path).tensors)
    if found is None:
        raise ModelLoadError(f"{FIELD} = {str(path)!r}: no Qwen-Image transformer in it "
                             f"(txt_norm.weight, img_in.weight)")
    return found.header


def load_qwen_file(path: Path, section: Any, *, dtype: Any = None, defer_denoiser: bool = False,
                   store: bool = True, text_frozen: bool = True) -> dict[str, Any]:
    """The BaseModel fields of a Qwen-Image single file and its part files, built in ``dtype``
    (fp8 storage of the transformer with model.base_precision = "fp8" where ``store``);
    ``defer_denoiser``: the transformer is built later by ``build_denoiser(dtype)``."""
    from trainer.families.common.qwen_tokenizers import load_qwen_tokenizer
    from trainer.families.qwen_image.tiny import scheduler

    info = file_info(path)
    variant = file_variant(path, section, info)
    refuse_variant(path, variant)
    if not store and variant != "base":  # its copy would be written as Qwen-Image's pipeline
        raise ModelLoadError(f"model.cache_as_diffusers: no diffusers copy of "
                             f"{LABELS[variant]} is kept yet; unset it (the files load as "
                             f"they are)")
    dtype = dtype or torch.float32
    root = _transformer_root(info, section.config_dir, path)
    fp8 = store and section.base_precision == "fp8"
    main = Weights(path, FIELD)
    vae = build_vae(_source("vae", info, main, section), config_root(section.config_dir, "vae"),
                    dtype)
    encoder = build_text_encoder(_source("text_encoder", info, main, section),
                                 config_root(section.config_dir, "text_encoder"), dtype,
                                 fp8=store and section.fp8_text_encoders and text_frozen)

    def later(build_dtype: torch.dtype) -> Any:
        return build_transformer(path, info, root, build_dtype, fp8, variant)

    tokenizer = load_qwen_tokenizer("qwen25vl", section.tokenizer,
                                    [p for p in (section.text_encoder, path) if p])
    return dict(denoiser=None if defer_denoiser else later(dtype),
                build_denoiser=later if defer_denoiser else None, vae=vae,
                text_encoder=encoder, tokenizer=tokenizer,
                **processor_fields(variant, section, tokenizer,
                                   [p for p in (path, section.text_encoder) if p]),
                noise_scheduler=scheduler(), version="qwen_image", variant=variant,
                prediction_type="flow", source=str(path), name=path.stem,
                description=described(variant, info))
