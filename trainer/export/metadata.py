"""Training metadata of a LoRA file: sd-scripts' ``ss_*`` keys and sai_model_spec ``modelspec.*``.

The ``ss_*`` keys are written the way sd-scripts' ``train_network.py`` writes them, so that the
tools that read them (sd-webui-additional-networks, AUTOMATIC1111's LoRA cards, ComfyUI nodes,
Civitai, sd-scripts' own resize/merge scripts) find what they expect: every value is a string,
made with Python's ``str()`` (``"True"``, ``"None"``, ``"0.0001"``, ``"(512, 512)"``), and the
nested values (``ss_tag_frequency``, ``ss_bucket_info``, ``ss_dataset_dirs``,
``ss_network_args``) are JSON. A setting that is off is written as ``"None"``, as sd-scripts does.

The facts of a run that the config cannot tell (steps done, image counts, buckets, tags, the
precision actually used, ...) come in a :class:`RunFacts` that the training loop fills in;
:func:`count_tags` counts a folder's tags the way sd-scripts does.

``modelspec.*`` follows Stability AI's ModelSpec 1.0.1 as sd-scripts' ``sai_model_spec.py`` fills
it (architecture ``stable-diffusion-v1/lora``, implementation ``diffusers`` for SD 1.x/2.x LoRA,
resolution ``512x512``, date in ISO 8601, prediction type ``epsilon`` or ``v``, title defaulting to
the output name). The ``sshs_*`` hashes are added by :mod:`trainer.export.hashes` once the
tensors exist.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import time
from collections.abc import Iterable
from typing import Any, Literal, Optional

NETWORK_MODULE = "networks.lora"
SPEC_VERSION = "1.0.1"
IMPL_DIFFUSERS = "diffusers"
IMPL_STABILITY_AI = "https://github.com/Stability-AI/generative-models"
DEFAULT_FAMILY = "sd1"  # the family of model_version = "auto" in a file's metadata

# The optimizer class sd-scripts records (``module.Class``) for each optimizer name.
OPTIMIZER_CLASSES = {
    "AdamW": "torch.optim.adamw.AdamW",
    "AdamW8bit": "bitsandbytes.optim.adamw.AdamW8bit",
    "Lion": "lion_pytorch.lion_pytorch.Lion",
    "Lion8bit": "bitsandbytes.optim.lion.Lion8bit",
    "Adafactor": "transformers.optimization.Adafactor",
    "Prodigy": "prodigyopt.prodigy.Prodigy",
}

ModelVersion = Literal["sd1", "sd2", "sdxl"]


@dataclasses.dataclass
class RunFacts:
    """What the training loop knows about a run and the config does not.

    Fill the run-wide fields once, then ``dataclasses.replace(facts, steps=..., epoch=...)`` at
    each save. ``None`` fields fall back to the config where it can tell (model version,
    prediction type, mixed precision, resolution).
    """

    steps: int = 0  # optimizer steps done when this file is saved
    epoch: int = 0  # epochs done when this file is saved
    max_train_steps: int = 0
    num_epochs: int = 0
    num_batches_per_epoch: int = 0
    num_train_images: int = 0  # including repeats, as sd-scripts counts them
    num_reg_images: int = 0
    num_processes: int = 1
    # {"10_cat": {"n_repeats": 10, "img_count": 12}}: the folder name, not the full path
    dataset_dirs: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    reg_dataset_dirs: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # {"10_cat": {"cat": 12, "red": 3}} (see count_tags)
    tag_frequency: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # {"buckets": {0: {"resolution": (512, 512), "count": 40}}, "mean_img_ar_error": 0.0}
    bucket_info: Optional[dict[str, Any]] = None
    training_started_at: float = dataclasses.field(default_factory=time.time)
    training_finished_at: Optional[float] = None  # None: the time of the save
    session_id: int = dataclasses.field(default_factory=lambda: secrets.randbelow(2**32))
    base_model_version: Optional[ModelVersion] = None  # resolved architecture
    prediction_type: Optional[Literal["epsilon", "v_prediction"]] = None  # resolved
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = None  # actually used
    resolution: Optional[tuple[int, int]] = None  # (width, height); None: dataset.resolution
    optimizer: Optional[str] = None  # the optimizer class actually used, ``module.Class``
    sd_model_hash: Optional[str] = None  # hashes.file_hashes() of a single-file base model
    new_sd_model_hash: Optional[str] = None
    vae_hash: Optional[str] = None
    new_vae_hash: Optional[str] = None
    training_comment: Optional[str] = None
    base_model_hash: Optional[str] = None  # hashes.model_short_hash() of the base (file or folder)


def count_tags(captions: Iterable[str]) -> dict[str, int]:
    """Tag counts of a folder's captions as sd-scripts counts them for ``ss_tag_frequency``:
    comma-separated, stripped, lower-cased, empty tags skipped."""
    counts: dict[str, int] = {}
    for caption in captions:
        for tag in caption.split(","):
            tag = tag.strip().lower()
            if tag:
                counts[tag] = counts.get(tag, 0) + 1
    return counts


def naming_family(version: str) -> str:
    """The family whose kohya naming a UNet LoRA of ``version`` takes: its own where its
    ``lora`` role names UNet LoRA files (trainer/families/sd/lora.py), else SD 1.x's (as for
    ``auto``; the transformer families' files are named by their own writers)."""
    from trainer.families import FAMILIES, role

    found = role(version, "lora") if version in FAMILIES else None
    return version if hasattr(found, "TE_PREFIXES") else DEFAULT_FAMILY


def lora_naming(version: str) -> Any:
    """The ``lora`` role of :func:`naming_family`: text encoder prefixes, the UNet's rename,
    the version strings."""
    from trainer.families import role

    return role(naming_family(version), "lora")


def base_model_version_str(version: ModelVersion, v_prediction: bool) -> str:
    """sd-scripts' ``ss_base_model_version``: sd_v1, sd_v2, sd_v2_v (sd_v1_v), sdxl_base_v1-0."""
    return lora_naming(version).base_model_version(naming_family(version), v_prediction)


def modelspec_architecture(version: ModelVersion, v_prediction: bool,
                           adapter: Optional[str] = "lora") -> str:
    """``stable-diffusion-v1``, ``-v2-512``, ``-v2-768-v``, ``-xl-v1-base``, + ``/lora`` etc."""
    arch = lora_naming(version).modelspec_architecture(naming_family(version), v_prediction)
    return f"{arch}/{adapter}" if adapter else arch


def resolved_version(cfg: Any, facts: RunFacts) -> ModelVersion:
    if facts.base_model_version is not None:
        return facts.base_model_version
    version = cfg.model.model_version
    return DEFAULT_FAMILY if version == "auto" else version


def is_v_prediction(cfg: Any, facts: RunFacts) -> bool:
    return (facts.prediction_type or cfg.model.prediction_type) == "v_prediction"


def resolution_of(cfg: Any, facts: RunFacts) -> tuple[int, int]:
    """(width, height): sd-scripts writes ss_resolution as the tuple's text, "(512, 768)"."""
    from trainer.config.sections.resolution import base_size

    return facts.resolution or base_size(cfg.dataset.resolution)


def _studio_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kohya-studio")
    except PackageNotFoundError:
        return "unknown"


def modelspec_metadata(cfg: Any, facts: RunFacts, *, adapter: Optional[str] = "lora",
                       timestamp: Optional[float] = None) -> dict[str, str]:
    """The ``modelspec.*`` keys (sai_model_spec 1.0.1) of a LoRA, an embedding or a model."""
    version, v_pred = resolved_version(cfg, facts), is_v_prediction(cfg, facts)
    save = cfg.saving
    width, height = resolution_of(cfg, facts)
    stamp = time.time() if timestamp is None else timestamp
    sgm = adapter == "textual-inversion" or adapter is None or lora_naming(version).SGM_LAYOUT
    meta = {
        "modelspec.sai_model_spec": SPEC_VERSION,
        "modelspec.architecture": modelspec_architecture(version, v_pred, adapter),
        "modelspec.implementation": IMPL_STABILITY_AI if sgm else IMPL_DIFFUSERS,
        "modelspec.implementation_version": f"kohya-studio/{_studio_version()}",
        "modelspec.title": save.metadata_title or save.output_name,
        "modelspec.resolution": f"{width}x{height}",
        "modelspec.date": datetime.datetime.fromtimestamp(int(stamp)).isoformat(),
        "modelspec.prediction_type": "v" if v_pred else "epsilon",
    }
    for key in ("author", "description", "license", "tags"):  # tags: sd-scripts' metadata_tags
        value = getattr(save, f"metadata_{key}")
        if value is not None:
            meta[f"modelspec.{key}"] = value
    if cfg.model.clip_skip > 1:
        meta["modelspec.encoder_layer"] = str(cfg.model.clip_skip)
    return meta


def _num(value: float) -> str:
    """A number as a user would type it in sd-scripts' ``network_args`` (``4``, ``0.5``)."""
    return str(int(value)) if float(value).is_integer() else str(value)


def network_module(cfg: Any) -> str:
    """``ss_network_module``: ``networks.lora`` for peft LoRA, ``lycoris.kohya`` for LyCORIS."""
    if cfg.network.network_type == "lora":
        return NETWORK_MODULE if cfg.network.dylora_unit is None else "networks.dylora"
    from trainer.export.lycoris_args import NETWORK_MODULE as LYCORIS_MODULE

    return LYCORIS_MODULE


def network_args(cfg: Any) -> dict[str, str]:
    """sd-scripts' ``network_args`` (``conv_dim``, ``conv_alpha``) as strings, as it parses them;
    for LyCORIS types the ``lycoris.kohya`` ones (trainer/export/lycoris.py)."""
    net = cfg.network
    if net.network_type != "lora":
        from trainer.export.lycoris_args import lycoris_network_args

        return lycoris_network_args(cfg)
    unit = {} if net.dylora_unit is None else {"unit": _num(net.dylora_unit)}
    if net.conv_dim is None:
        return unit
    if net.dylora_unit is not None:  # networks.dylora trains its convolutions at network_alpha
        return {"conv_dim": _num(net.conv_dim), "conv_alpha": _num(net.network_alpha), **unit}
    alpha = net.conv_alpha if net.conv_alpha is not None else net.conv_dim
    return {"conv_dim": _num(net.conv_dim), "conv_alpha": _num(alpha)}


def optimizer_string(cfg: Any, facts: RunFacts) -> str:
    """``module.Class(weight_decay=0.01,k=v)``, like sd-scripts' ``ss_optimizer``."""
    opt = cfg.optimizer
    name = facts.optimizer or OPTIMIZER_CLASSES.get(opt.optimizer_type, opt.optimizer_type)
    kwargs = {"weight_decay": opt.weight_decay, **opt.optimizer_args}
    return name + "(" + ",".join(f"{k}={v}" for k, v in kwargs.items()) + ")"


def _ss_network(cfg: Any, facts: RunFacts) -> dict[str, Any]:
    net, version = cfg.network, resolved_version(cfg, facts)
    return {
        "ss_network_module": network_module(cfg),
        "ss_network_dim": net.network_dim,
        "ss_network_alpha": net.network_alpha,
        "ss_network_dropout": net.network_dropout,
        "ss_network_args": json.dumps(network_args(cfg)),
        "ss_base_model_version": base_model_version_str(version, is_v_prediction(cfg, facts)),
        "ss_v2": lora_naming(version).is_v2(naming_family(version)),
        "ss_clip_skip": cfg.model.clip_skip,
        "ss_max_token_length": cfg.dataset.max_token_length,  # None: 75, the CLIP window
    }


def _ss_training(cfg: Any, facts: RunFacts) -> dict[str, Any]:
    opt, tr = cfg.optimizer, cfg.training
    precision = facts.mixed_precision or (
        "no" if tr.mixed_precision == "auto" else tr.mixed_precision)
    return {
        "ss_session_id": facts.session_id,
        "ss_training_started_at": facts.training_started_at,
        "ss_output_name": cfg.saving.output_name,
        "ss_learning_rate": opt.learning_rate,
        "ss_unet_lr": opt.unet_lr,
        "ss_text_encoder_lr": opt.text_encoder_lr,
        "ss_optimizer": optimizer_string(cfg, facts),
        "ss_lr_scheduler": opt.lr_scheduler,
        "ss_lr_warmup_steps": opt.lr_warmup_steps,
        "ss_max_grad_norm": opt.max_grad_norm,
        "ss_max_train_steps": facts.max_train_steps,
        "ss_num_epochs": facts.num_epochs,
        "ss_num_batches_per_epoch": facts.num_batches_per_epoch,
        "ss_gradient_accumulation_steps": tr.gradient_accumulation_steps,
        "ss_gradient_checkpointing": tr.gradient_checkpointing,
        "ss_batch_size_per_device": tr.train_batch_size,
        "ss_total_batch_size": (tr.train_batch_size * tr.gradient_accumulation_steps
                                * facts.num_processes),
        "ss_mixed_precision": precision,
        "ss_full_fp16": tr.full_fp16,
        "ss_full_bf16": tr.full_bf16,
        "ss_seed": tr.seed,
        "ss_noise_offset": tr.noise_offset,
        "ss_zero_terminal_snr": tr.zero_terminal_snr,
        "ss_min_snr_gamma": tr.min_snr_gamma,
        "ss_prior_loss_weight": tr.prior_loss_weight,
        "ss_training_comment": facts.training_comment or cfg.saving.training_comment,
        **_ss_loss(tr),
    }


def _ss_loss(tr: Any) -> dict[str, Any]:
    """The noise and loss options, under the names sd-scripts' train_network.py writes."""
    return {
        "ss_adaptive_noise_scale": tr.adaptive_noise_scale,
        "ss_noise_offset_random_strength": tr.noise_offset_random_strength,
        "ss_multires_noise_iterations": tr.multires_noise_iterations,
        "ss_multires_noise_discount": tr.multires_noise_discount,
        "ss_debiased_estimation": tr.debiased_estimation_loss,
        "ss_loss_type": tr.loss_type,
        "ss_huber_schedule": tr.huber_schedule,
        "ss_huber_c": tr.huber_c,
        "ss_huber_scale": tr.huber_scale,
    }


def _ss_dataset(cfg: Any, facts: RunFacts) -> dict[str, Any]:
    ds = cfg.dataset
    return {
        "ss_num_train_images": facts.num_train_images,
        "ss_num_reg_images": facts.num_reg_images,
        "ss_resolution": resolution_of(cfg, facts),
        "ss_enable_bucket": ds.enable_bucket,
        "ss_min_bucket_reso": ds.min_bucket_reso,
        "ss_max_bucket_reso": ds.max_bucket_reso,
        "ss_bucket_no_upscale": ds.bucket_no_upscale,
        "ss_bucket_info": json.dumps(facts.bucket_info, default=_jsonable),
        "ss_tag_frequency": json.dumps(facts.tag_frequency),
        "ss_dataset_dirs": json.dumps(facts.dataset_dirs),
        "ss_reg_dataset_dirs": json.dumps(facts.reg_dataset_dirs),
        "ss_cache_latents": ds.cache_latents,
        "ss_shuffle_caption": ds.shuffle_caption,
        "ss_keep_tokens": ds.keep_tokens,
        "ss_flip_aug": ds.flip_aug,
        "ss_color_aug": ds.color_aug,
        "ss_random_crop": ds.random_crop,
        "ss_caption_dropout_rate": ds.caption_dropout_rate,
        "ss_caption_dropout_every_n_epochs": ds.caption_dropout_every_n_epochs,
        "ss_caption_tag_dropout_rate": ds.caption_tag_dropout_rate,
        "ss_face_crop_aug_range": None,
    }


def _jsonable(value: Any) -> Any:
    """numpy scalars and tensors (a mean aspect-ratio error, a bucket size) as plain numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _ss_models(cfg: Any, facts: RunFacts) -> dict[str, Any]:
    """ss_sd_model_name (the file or folder name of a local model) and hashes when known."""
    out: dict[str, Any] = {}
    for key, path, legacy, new in (
        ("sd_model", cfg.model.pretrained_model_name_or_path, facts.sd_model_hash,
         facts.new_sd_model_hash),
        ("vae", cfg.model.vae, facts.vae_hash, facts.new_vae_hash),
    ):
        if path is None:
            continue
        name = os.path.basename(os.path.normpath(path)) if os.path.exists(path) else path
        out[f"ss_{key}_name"] = name
        if legacy is not None:
            out[f"ss_{key}_hash"] = legacy
        if new is not None:
            out[f"ss_new_{key}_hash"] = new
    return out


def training_metadata(cfg: Any, facts: RunFacts) -> dict[str, str]:
    """The ``ss_*`` keys of a LoRA trained with ``cfg``, at the moment ``facts`` describe."""
    finished = facts.training_finished_at
    meta: dict[str, Any] = {
        **_ss_training(cfg, facts),
        **_ss_network(cfg, facts),
        **_ss_dataset(cfg, facts),
        **_ss_models(cfg, facts),
        "ss_training_finished_at": time.time() if finished is None else finished,
        "ss_steps": facts.steps,
        "ss_epoch": facts.epoch,
    }
    return {k: str(v) for k, v in meta.items()}


def build_lora_metadata(cfg: Any, facts: RunFacts) -> dict[str, str]:
    """``ss_*`` and ``modelspec.*`` metadata of a LoRA file (the ``sshs_*`` hashes come later,
    from :func:`trainer.export.hashes.add_hashes`, because they need the tensors)."""
    meta = training_metadata(cfg, facts)
    finished = float(meta["ss_training_finished_at"])
    meta.update(modelspec_metadata(cfg, facts, adapter="lora", timestamp=finished))
    return meta
