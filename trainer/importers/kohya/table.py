"""The kohya_ss GUI JSON keys and what becomes of each: the declarative part of the importer.

``DIRECT``: kohya key -> (our dotted key, converter), with the converters it needs (sampler
and optimizer names, token lengths). ``DERIVED`` (in derived.py): keys
that combine with others (steps and epochs, warm-up, LoRA_type, learning rates...).
``NOT_NEEDED`` and ``NOT_SUPPORTED``: keys that do not map, each with its reason; ``FAMILY``:
settings of model families this studio does not train. Every key of a file lands in exactly one
of these, or in the report's "unknown" list.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from trainer.config.sections.outputs import SamplingSection
from trainer.importers.kohya import convert as c
from trainer.importers.kohya.network_options import NETWORK_DIRECT
from trainer.importers.kohya.run_options import RUN_DIRECT

TRAINED = ("lora", "dreambooth")


@dataclass(frozen=True)
class Noted:
    """A converted value with a note for the report."""

    value: Any
    note: str


@dataclass(frozen=True)
class Refused:
    """A value this studio cannot take: reported as not supported, with the reason."""

    reason: str


@dataclass(frozen=True)
class Rule:
    target: str
    convert: Callable[[Any], Any]
    modes: tuple[str, ...] = ("lora", "dreambooth", "textual_inversion")


def caption_extension(value: Any) -> Any:
    """kohya users name a missing extension (``.none-use-foldername``, ``.txt-no``) to caption
    by folder name; ours allows letters, digits and '_', so other characters become '_'
    (still no such files, so the folder name is still the caption). An empty one is not
    passed by kohya_ss (it drops empty values from the TOML it hands sd-scripts), so
    sd-scripts reads its default, ``.caption``."""
    if isinstance(value, str) and not value.strip():
        return Noted(".caption", "empty: kohya_ss passes nothing, so sd-scripts reads its "
                                 "default, .caption")
    text = c.to_text(value)
    if text is c.UNSET or re.fullmatch(r"\.[A-Za-z0-9_]+", text):
        return text
    fixed = "." + re.sub(r"[^A-Za-z0-9_]", "_", text.lstrip("."))
    return Noted(fixed, f"{text!r} becomes {fixed!r} (the schema allows letters, digits, '_')")


def bucket_step(value: Any) -> Any:
    """Our bucket sides are multiples of 8 (the VAE's factor); a smaller step rounds up."""
    step = c.to_int(value)
    if step is c.UNSET or step % 8 == 0:
        return step
    fixed = max(8, -(-step // 8) * 8)
    return Noted(fixed, f"{step} becomes {fixed}: bucket sides here are multiples of 8")


def sampler(value: Any) -> Any:
    """sd-scripts' sample samplers (``get_my_scheduler``; the k_ names are the same samplers);
    sd-scripts samples with DDIM for a name it does not know."""
    if c.is_empty(value):
        return c.UNSET
    name = SAMPLER_NAMES.get(str(value).strip().lower())
    return name or Noted("ddim", f"{value!r} is not a sampler of sd-scripts, which then "
                                 f"samples with ddim")


def prompts(value: Any) -> Any:
    """sd-scripts' prompt lines, with their options (``--n negative --s 20``), which the
    samples read the same way (trainer/run/sample_prompts.py)."""
    return c.prompt_lines(value)


def log_with(value: Any) -> Any:
    """sd-scripts' trackers: tensorboard, wandb, all (trainer/run/trackers.py)."""
    if c.is_empty(value):
        return c.UNSET
    if value in ("tensorboard", "wandb", "all"):
        return value
    return Noted("tensorboard", f"{value!r} is not a tracker sd-scripts knows; logs go to "
                                f"TensorBoard")


def save_state_at_end(value: Any) -> Any:
    out = c.to_bool(value)
    if out is True:
        return Noted(True, "saving.save_state also saves a state with every intermediate save")
    return c.UNSET


def masked_loss(value: Any) -> Any:
    if c.to_bool(value) is True:
        return Refused("kohya_ss takes the masks from the dataset config; set "
                       "training.masked_loss with dataset.alpha_mask or dataset.mask_data_dir")
    return c.UNSET


def compile_backend(value: Any) -> Any:
    if c.is_empty(value) or str(value).lower() == "no":
        return c.UNSET
    return Noted(True, f"torch.compile with its default backend (kohya asked for {value!r})")


# sd-scripts' sampler spellings -> ours (library/train_util.py get_my_scheduler)
SAMPLER_NAMES: dict[str, str] = {
    **{n: n for n in get_args(SamplingSection.model_fields["sample_sampler"].annotation)},
    "k_lms": "lms", "k_euler": "euler", "k_euler_a": "euler_a", "k_dpm_2": "dpm_2",
    "k_dpm_2_a": "dpm_2_a",
}


# Optimizers that kohya_ss users name without their package: the import path of the class
# (CAME, Luo et al. 2023: the authors' package came-pytorch)
CLASS_PATHS = {"CAME": "came_pytorch.CAME"}


def optimizer_target(name: Any) -> tuple[str, str]:
    """(our key, value): sd-scripts' --optimizer_type also takes ``module.Class``, which is
    optimizer.optimizer_class here."""
    name = CLASS_PATHS.get(str(name), str(name))
    return ("optimizer.optimizer_class" if "." in name else "optimizer.optimizer_type"), name


def token_length(value: Any) -> Any:
    """kohya_ss's max_token_length: 75 (its default) is CLIP's own window, i.e. unset here."""
    n = c.to_int(value)
    return c.UNSET if n is c.UNSET or n in (0, 75) else n


# kohya key -> (our dotted key, converter): ip noise, captions, metadata; DIRECT takes them
EXTRA_DIRECT: dict[str, tuple[str, Any]] = {
    "ip_noise_gamma": ("training.ip_noise_gamma", c.nonzero(c.to_float)),
    "ip_noise_gamma_random_strength": ("training.ip_noise_gamma_random_strength", c.to_bool),
    "v_pred_like_loss": ("training.v_pred_like_loss", c.nonzero(c.to_float)),
    "weighted_captions": ("dataset.weighted_captions", c.to_bool),
    "max_token_length": ("dataset.max_token_length", token_length),
    "caption_dropout_every_n_epochs": ("dataset.caption_dropout_every_n_epochs",
                                       c.nonzero(c.to_int)),
    "no_token_padding": ("dataset.no_token_padding", c.to_bool),
    "training_comment": ("saving.training_comment", c.to_text),
    "metadata_tags": ("saving.metadata_tags", c.to_text),
}


pos_float, pos_int = c.nonzero(c.to_float), c.nonzero(c.to_int)

DIRECT: dict[str, Rule] = {
    "pretrained_model_name_or_path": Rule("model.pretrained_model_name_or_path", c.to_text),
    "vae": Rule("model.vae", c.to_text),
    "clip_skip": Rule("model.clip_skip", pos_int),
    "train_data_dir": Rule("dataset.train_data_dir", c.to_text),
    "image_folder": Rule("dataset.train_data_dir", c.to_text),  # the finetune tab's name
    # the finetune tab: its images lie directly in image_folder (1 included: they must train)
    "dataset_repeats": Rule("dataset.dataset_repeats", pos_int),
    "reg_data_dir": Rule("dataset.reg_data_dir", c.to_text, TRAINED),
    "dataset_config": Rule("dataset.dataset_config", c.to_text),
    "caption_extension": Rule("dataset.caption_extension", caption_extension),
    "enable_bucket": Rule("dataset.enable_bucket", c.to_bool),
    "min_bucket_reso": Rule("dataset.min_bucket_reso", c.to_int),
    "max_bucket_reso": Rule("dataset.max_bucket_reso", c.to_int),
    "bucket_reso_steps": Rule("dataset.bucket_reso_steps", bucket_step),
    "bucket_no_upscale": Rule("dataset.bucket_no_upscale", c.to_bool),
    "random_crop": Rule("dataset.random_crop", c.to_bool),
    "flip_aug": Rule("dataset.flip_aug", c.to_bool),
    "shuffle_caption": Rule("dataset.shuffle_caption", c.to_bool),
    "enable_wildcard": Rule("dataset.enable_wildcard", c.to_bool),  # sd-scripts flag only
    "keep_tokens": Rule("dataset.keep_tokens", c.to_int),
    "caption_dropout_rate": Rule("dataset.caption_dropout_rate", c.to_float),
    "caption_tag_dropout_rate": Rule("dataset.caption_tag_dropout_rate", c.to_float),
    "cache_latents": Rule("dataset.cache_latents", c.to_bool),
    "cache_latents_to_disk": Rule("dataset.cache_latents_to_disk", c.to_bool),
    "sdxl_cache_text_encoder_outputs": Rule("dataset.cache_text_encoder_outputs", c.to_bool),
    "token_string": Rule("network.token_string", c.to_text, ("textual_inversion",)),
    "init_word": Rule("network.init_word", c.to_text, ("textual_inversion",)),
    # the textual-inversion tab's "Resume TI training" file (sd-scripts' --weights)
    "weights": Rule("network.embedding_weights", c.to_text, ("textual_inversion",)),
    "num_vectors_per_token": Rule("network.num_vectors_per_token", c.to_int,
                                  ("textual_inversion",)),
    "template": Rule("network.caption_templates", c.choice(
        {"caption": c.UNSET, "object template": "object", "style template": "style"}),
        ("textual_inversion",)),
    "learning_rate": Rule("optimizer.learning_rate", c.to_float),
    "lr_scheduler": Rule("optimizer.lr_scheduler", c.to_text),
    "lr_scheduler_args": Rule("optimizer.lr_scheduler_args", c.key_values_or_unset),
    "lr_scheduler_power": Rule("optimizer.lr_scheduler_power", c.to_float),
    "max_grad_norm": Rule("optimizer.max_grad_norm", c.to_float),
    "train_batch_size": Rule("training.train_batch_size", c.to_int),
    "gradient_accumulation_steps": Rule("training.gradient_accumulation_steps", c.to_int),
    "mixed_precision": Rule("training.mixed_precision", c.to_text),
    "full_bf16": Rule("training.full_bf16", c.to_bool),
    "gradient_checkpointing": Rule("training.gradient_checkpointing", c.to_bool),
    "seed": Rule("training.seed", pos_int),
    "min_snr_gamma": Rule("training.min_snr_gamma", pos_float),
    "prior_loss_weight": Rule("training.prior_loss_weight", c.to_float, TRAINED),
    "resume": Rule("training.resume", c.to_text),
    "logging_dir": Rule("training.logging_dir", c.to_text),
    "log_with": Rule("training.log_with", log_with),
    "zero_terminal_snr": Rule("training.zero_terminal_snr", c.to_bool),  # a flag only
    "min_timestep": Rule("training.min_timestep", pos_int),
    "max_timestep": Rule("training.max_timestep", pos_int),
    "debiased_estimation_loss": Rule("training.debiased_estimation_loss", c.to_bool),
    "scale_v_pred_loss_like_noise_pred": Rule("training.scale_v_pred_loss_like_noise_pred",
                                              c.to_bool),
    "loss_type": Rule("training.loss_type", c.to_text),
    "huber_schedule": Rule("training.huber_schedule", c.to_text),
    "huber_c": Rule("training.huber_c", c.to_float),
    "huber_scale": Rule("training.huber_scale", c.to_float),
    "masked_loss": Rule("training.masked_loss", masked_loss),
    "dynamo_backend": Rule("training.compile", compile_backend),
    "sample_prompts": Rule("sampling.sample_prompts", prompts),
    "sample_every_n_steps": Rule("sampling.sample_every_n_steps", pos_int),
    "sample_every_n_epochs": Rule("sampling.sample_every_n_epochs", pos_int),
    "sample_sampler": Rule("sampling.sample_sampler", sampler),
    "output_dir": Rule("saving.output_dir", c.to_text),
    "output_name": Rule("saving.output_name", c.to_text),
    "save_precision": Rule("saving.save_precision", c.choice(
        {"fp16": "fp16", "bf16": "bf16", "float": "fp32", "fp32": "fp32"})),
    "save_every_n_epochs": Rule("saving.save_every_n_epochs", pos_int),
    "save_every_n_steps": Rule("saving.save_every_n_steps", pos_int),
    "save_state": Rule("saving.save_state", lambda v: True if c.to_bool(v) is True else c.UNSET),
    "save_state_on_train_end": Rule("saving.save_state", save_state_at_end),
    "metadata_title": Rule("saving.metadata_title", c.to_text),
    "metadata_author": Rule("saving.metadata_author", c.to_text),
    "metadata_description": Rule("saving.metadata_description", c.to_text),
    "metadata_license": Rule("saving.metadata_license", c.to_text),
}

DIRECT.update({key: Rule(target, convert) for key, (target, convert) in EXTRA_DIRECT.items()})
DIRECT.update({key: Rule(target, convert) for key, (target, convert) in RUN_DIRECT.items()})
DIRECT.update({key: Rule(target, convert, ("lora",))  # LoRA+, block-wise, network_weights
               for key, (target, convert) in NETWORK_DIRECT.items()})

_ATTN = "attention here is always PyTorch's scaled-dot-product attention"
_LAUNCH = "accelerate launch settings of kohya_ss; one process trains here (training.num_processes)"
_HUB_TOKEN = ("huggingface_hub reads the token from HF_TOKEN or `hf auth login`; it is not kept "
              "in the config (saving.huggingface_repo_id uploads with it)")
NOT_NEEDED: dict[str, str] = {
    **dict.fromkeys(("xformers", "mem_eff_attn", "sdpa"), _ATTN),
    **dict.fromkeys(("gpu_ids", "num_cpu_threads_per_process", "num_machines",
                     "main_process_port", "extra_accelerate_launch_args"), _LAUNCH),
    "huggingface_token": _HUB_TOKEN,
    **dict.fromkeys(("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic"),
                    "torch.compile runs with its defaults here (training.compile)"),
    "wandb_api_key": "W&B reads its key from WANDB_API_KEY or `wandb login`; it is not kept "
                     "in the config (WANDB_MODE=offline needs none)",
    "log_config": "the config is always logged to the trackers (as hyperparameters)",
    "log_prefix": "the logs are named by training.log_tracker_name under training.logging_dir",
    **dict.fromkeys(("max_data_loader_n_workers", "persistent_data_loader_workers",
                     "vae_batch_size", "skip_cache_check"),
                    "data loading and latent caching are tuned by the trainer"),
    **dict.fromkeys(("highvram", "lowvram", "disable_mmap_load_safetensors",
                     "sdxl_no_half_vae"),
                    "memory handling that the trainer does itself (the VAE runs in fp32)"),
    **dict.fromkeys(("save_as_bool", "file_path", "model_list", "full_path"),
                    "a kohya_ss GUI control, not a training setting"),
    "save_model_as": "LoRA files are always .safetensors; DreamBooth writes a diffusers folder "
                     "and a single .safetensors file",
    "use_8bit_adam": "an old spelling of optimizer = AdamW8bit, which the optimizer key gives",
    "noise_offset_type": "read together with noise_offset / multires_noise_* (it picks which)",
    "train_dir": "the finetune tab's working folder; outputs go to saving.output_dir",
    **dict.fromkeys(("create_caption", "create_buckets", "generate_caption_database", "batch_size",
                     "generate_image_buckets", "use_latent_files", "caption_metadata_filename",
                     "latent_metadata_filename"),
                    "finetune metadata preparation; captions and buckets are read from the "
                    "folder here"),
    # kohya_ss's "Conv" tab of April-July 2023 (then renamed conv_block_dims / _alphas)
    **dict.fromkeys(("conv_dims", "conv_alphas"),
                    "kohya_ss's 2023 name of the per-block conv ranks / alphas, which it passed "
                    "to sd-scripts as network_args conv_dims / conv_alphas; networks.lora never "
                    "reads those (its names are conv_block_dims / conv_block_alphas, "
                    "network.conv_block_dims / conv_block_alphas here), so the LoRA trained "
                    "without them, as here"),
    "rank_dropout_scale": "nothing sd-scripts runs reads it: kohya_ss passes it (for the "
                          "LyCORIS types) in network_args to lycoris.kohya, whose "
                          "create_network never reads it, so lycoris' modules drop ranks "
                          "without rescaling, as here (network.rank_dropout)",
}

NOT_SUPPORTED: dict[str, str] = {
    "train_inpainting": "inpainting training (sd-scripts 0.10.4+: a 9-channel UNet fed the "
                        "noisy latents, a random mask and the masked image's latents, with "
                        "sd-scripts' mask generator and inpainting samples) is not available "
                        "here; the model would train as a plain text-to-image model",
}

# Values of NOT_SUPPORTED keys that mean "off" in kohya_ss beyond empty / 0 / false.
OFF_VALUES: dict[str, tuple[Any, ...]] = {}

_FAMILY_KEYS = (
    "ae", "clip_l", "clip_g", "t5xxl", "t5xxl_device", "t5xxl_dtype", "t5xxl_lr",
    "t5xxl_max_token_length", "train_t5xxl", "apply_t5_attn_mask", "guidance_scale",
    "discrete_flow_shift", "model_prediction_type", "timestep_sampling", "weighting_scheme",
    "logit_mean", "logit_std", "mode_scale", "split_mode", "mem_eff_save", "save_clip",
    "save_t5xxl", "cpu_offload_checkpointing", "blocks_to_swap", "single_blocks_to_swap",
    "double_blocks_to_swap", "flux_fused_backward_pass", "fp8_base_unet", "clip_g_dropout_rate",
    "pos_emb_random_crop_rate", "show_timesteps", "show_timesteps_resolution", "model_type",
    "train_double_block_indices", "train_single_block_indices", "img_attn_dim", "img_mlp_dim",
    "img_mod_dim", "txt_attn_dim", "txt_mlp_dim", "txt_mod_dim", "single_dim",
    "single_mod_dim", "in_dims", "train_blocks", "split_qkv", "enable_all_linear",
    "ggpo_beta", "ggpo_sigma", "train_lora_ggpo",
)
_FAMILY_PREFIXES = ("flux1_", "flux_", "sd3_", "anima_", "lumina_", "hunyuan_")
FAMILY_REASON = ("a setting of another model family (HunyuanImage, Anima, Lumina: not trained "
                 "here; FLUX.1 / SD3 keys are read with flux1_checkbox / sd3_checkbox)")

# Keys that say the file is for a family this studio does not train (refused when true);
# FLUX.1 and SD3 (flux1_checkbox, sd3_checkbox, LoRA_type Flux1) are flow.py's.
FAMILY_SWITCHES = {"hunyuan_image_checkbox": "HunyuanImage", "anima_checkbox": "Anima",
                   "lumina_checkbox": "Lumina Image 2.0"}
FAMILY_LORA_TYPES = {"HunyuanImage-2.1": "HunyuanImage", "Anima": "Anima",
                     "Lumina": "Lumina Image 2.0"}


def is_family_key(key: str) -> bool:
    return key in _FAMILY_KEYS or key.startswith(_FAMILY_PREFIXES)
