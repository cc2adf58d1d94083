"""The one config schema. Every setting of the studio is declared here, once.

TOML files, CLI overrides (``--set optimizer.learning_rate=2e-4``), presets, the GUI form and
``config_example.toml`` all go through :class:`TrainConfig`. Each field carries its type, its
default, its bounds, a one-line help text and UI hints (``label``: the name a person reads, shown
above the field with the TOML key beside it; ``modes``: the training modes that use it;
``advanced``: shown in the closed part of its section; ``widget``: a special editor such as a
folder path). Optional fields default to ``None`` (``None`` means off); a ``0`` is always a value.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1

MODES = ("lora", "dreambooth", "textual_inversion")
Mode = Literal["lora", "dreambooth", "textual_inversion"]
Widget = Literal["text", "dir", "file", "textarea", "list", "dict"]

EMBEDDED_MODEL = "embedded:tiny-sd15"
EMBEDDED_SDXL = "embedded:tiny-sdxl"
EMBEDDED_DATASET = "embedded:sample-dataset"


def setting(
    default: Any,
    help: str,
    *,
    label: Optional[str] = None,
    modes: tuple[str, ...] = MODES,
    advanced: bool = False,
    widget: Optional[Widget] = None,
    **bounds: Any,
) -> Any:
    """A schema field: default, bounds (ge/gt/le/lt), help and UI hints (the label people
    read, modes, advanced, widget) in one place."""
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
    ui: dict[str, Any] = {"modes": list(modes), "advanced": advanced}
    if label:
        ui["label"] = label
    if widget:
        ui["widget"] = widget
    return Field(default, description=help, json_schema_extra={"ui": ui}, **bounds)


class Section(BaseModel):
    """Base of every section: unknown keys are errors and assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(Section):
    pretrained_model_name_or_path: str = setting(
        EMBEDDED_MODEL,
        "Base model: a diffusers folder, a .safetensors/.ckpt file (SD 1.x, 2.x, SDXL), or "
        "the embedded embedded:tiny-sd15 / embedded:tiny-sdxl.",
        widget="dir",
        label="Base model",
    )
    model_version: Literal["auto", "sd1", "sd2", "sdxl"] = setting(
        "auto", "Architecture of the base model; auto reads it from the model's configs.",
        advanced=True,
        label="Model family",
    )
    prediction_type: Optional[Literal["epsilon", "v_prediction"]] = setting(
        None, "Training target; unset takes the base model's scheduler setting.", advanced=True,
        label="Prediction type",
    )
    vae: Optional[str] = setting(
        None, "A different VAE (diffusers folder or file) instead of the model's own.",
        advanced=True, widget="dir",
        label="VAE override",
    )
    clip_skip: int = setting(
        1, "Use the output of the n-th last text-encoder layer (2 for many anime SD 1.x models); "
        "1 is each family's own: SD 2.x's encoder ends at the layer SD 2 reads, SDXL counts from "
        "the penultimate layer, as sd-scripts and AUTOMATIC1111 do.",
        advanced=True, ge=1, le=12,
        label="CLIP skip",
    )
    tokenizer: Optional[str] = setting(
        None, "Tokenizer folder for a single-file model (the file holds none); unset looks "
        "beside the file, then in the Hugging Face cache.", advanced=True, widget="dir",
        label="Tokenizer folder",
    )
    config_dir: Optional[str] = setting(
        None, "Folder of diffusers component configs (unet/, vae/, text_encoder/, ...) for a "
        "single file of an unusual shape; unset uses the built-in SD 1.x, 2.x and SDXL ones.",
        advanced=True, widget="dir",
        label="Component config folder",
    )
    cache_as_diffusers: bool = setting(
        False, "Keep a diffusers copy of a single-file model in the studio's data folder, "
        "loaded faster next time; off writes nothing.", advanced=True,
        label="Keep a diffusers copy",
    )


class DatasetSection(Section):
    train_data_dir: str = setting(
        EMBEDDED_DATASET,
        "Folder of N_concept subfolders (N = repeats) with images and caption files.",
        widget="dir",
        label="Training images folder",
    )
    reg_data_dir: Optional[str] = setting(
        None, "Folder of N_class regularization images (prior preservation); they interleave "
        "with the training images, so an epoch has twice the steps.",
        modes=("lora", "dreambooth"), widget="dir",
        label="Regularization images folder",
    )
    num_class_images: Optional[int] = setting(
        None, "Make sure reg_data_dir holds this many class images: the missing ones are "
        "generated with the base model before training and kept for the next run.",
        modes=("lora", "dreambooth"), ge=1, le=100_000,
        label="Class images wanted",
    )
    class_prompt: Optional[str] = setting(
        None, "Prompt (and caption) of the generated class images, e.g. 'a photo of a dog'; "
        "unset uses the name of the one N_class folder in reg_data_dir.",
        modes=("lora", "dreambooth"),
        label="Class prompt",
    )
    dataset_config: Optional[str] = setting(
        None, "An sd-scripts dataset TOML ([general], [[datasets]], [[datasets.subsets]]) "
        "instead of train_data_dir and reg_data_dir: per-subset folders, repeats and caption "
        "options, per-dataset resolution and buckets; unset values come from this section.",
        advanced=True, widget="file",
        label="Dataset config (sd-scripts TOML)",
    )
    caption_extension: str = setting(
        ".txt", "Extension of the caption files beside the images.", advanced=True,
        pattern=r"^\.[A-Za-z0-9_]+$",
        label="Caption file extension",
    )
    resolution: int = setting(
        512, "Training resolution (the base side of the buckets), in pixels.",
        ge=64, le=4096, multiple_of=8,
        label="Resolution",
    )
    enable_bucket: bool = setting(True, "Aspect-ratio bucketing: train images at their shape.",
                                  label="Aspect-ratio buckets")
    min_bucket_reso: int = setting(
        256, "Smallest bucket side, in pixels.", advanced=True, ge=64, le=4096, multiple_of=8,
        label="Smallest bucket side",
    )
    max_bucket_reso: int = setting(
        1024, "Largest bucket side, in pixels.", advanced=True, ge=64, le=8192, multiple_of=8,
        label="Largest bucket side",
    )
    bucket_reso_steps: int = setting(
        64, "Step between bucket sides, in pixels.", advanced=True, ge=8, le=512, multiple_of=8,
        label="Bucket side step",
    )
    bucket_no_upscale: bool = setting(
        False, "Never upscale an image to fit a bucket; small images get smaller buckets.",
        advanced=True,
        label="Never upscale into a bucket",
    )
    random_crop: bool = setting(
        False, "Crop at a random place instead of the center.", advanced=True,
        label="Random crop",
    )
    flip_aug: bool = setting(False, "Also train on horizontally flipped images.", advanced=True,
                             label="Horizontal flip augmentation")
    alpha_mask: bool = setting(
        False, "With training.masked_loss: the loss mask is each image's alpha channel "
        "(transparent = not trained; an image without alpha trains everywhere).", advanced=True,
        label="Mask from the alpha channel",
    )
    mask_data_dir: Optional[str] = setting(
        None, "With training.masked_loss: folder of grayscale mask images named like the "
        "training images (white = train, black = ignore), directly inside or in subfolders "
        "named like the concept folders.", advanced=True, widget="dir",
        label="Mask images folder",
    )
    shuffle_caption: bool = setting(False, "Shuffle the comma-separated tags of each caption.",
                                    label="Shuffle caption tags")
    keep_tokens: int = setting(
        0, "Keep the first N tags in place when shuffling or dropping tags.", ge=0, le=255,
        label="Tags kept in place",
    )
    caption_dropout_rate: float = setting(
        0.0, "Probability of training an image with an empty caption.", advanced=True, ge=0, le=1,
        label="Caption dropout rate",
    )
    caption_tag_dropout_rate: float = setting(
        0.0, "Probability of dropping each tag (past keep_tokens).", advanced=True, ge=0, le=1,
        label="Tag dropout rate",
    )
    caption_prefix: Optional[str] = setting(
        None, "Text put before every caption.", advanced=True,
        label="Caption prefix",
    )
    caption_suffix: Optional[str] = setting(None, "Text put after every caption.", advanced=True,
                                            label="Caption suffix")
    cache_latents: bool = setting(True, "Encode every image once and keep the latents.",
                                  label="Cache latents")
    cache_latents_to_disk: bool = setting(
        False, "Keep the latent cache on disk, reused by the next run on the same data.",
        label="Cache latents on disk",
    )
    cache_dir: Optional[str] = setting(
        None, "Folder of the disk latent cache; unset uses .cache inside train_data_dir "
        "(beside the dataset_config TOML when that is set).",
        advanced=True, widget="dir",
        label="Latent cache folder",
    )
    cache_text_encoder_outputs: Optional[bool] = setting(
        None, "Encode each caption once instead of at every step; unset does so whenever it "
        "gives the same run (the text encoder is frozen and captions do not change per step: "
        "no shuffle, no dropout, no textual inversion); on refuses a config where it cannot.",
        advanced=True,
        label="Cache text-encoder outputs",
    )
    validation_split: Optional[float] = setting(
        None, "Hold out this fraction of the training images (the same ones every run, picked "
        "by training.seed; not trained on) and measure a validation loss on them.",
        gt=0, le=0.5,
        label="Validation fraction",
    )
    validation_data_dir: Optional[str] = setting(
        None, "A folder of N_concept subfolders of validation images (not trained on), "
        "instead of validation_split.", advanced=True, widget="dir",
        label="Validation images folder",
    )


NetworkType = Literal["lora", "locon", "loha", "lokr", "ia3", "dora"]


class NetworkSection(Section):
    network_type: NetworkType = setting(
        "lora", "Adapter: lora (peft LoRA, + conv_dim for LoCon); locon, loha, lokr, ia3 or "
        "dora (LoRA with weight decomposition) through the lycoris-lora package "
        "(network_module lycoris.kohya); ia3 has no rank and ignores network_dim/alpha.",
        modes=("lora",), label="Network type",
    )
    network_dim: int = setting(8, "LoRA rank.", modes=("lora",), ge=1, le=1024,
                               label="Network rank (dim)")
    network_alpha: float = setting(
        4.0, "LoRA alpha; the update is scaled by alpha / rank.", modes=("lora",), gt=0, le=4096,
        label="Network alpha",
    )
    network_dropout: Optional[float] = setting(
        None, "Dropout on the LoRA path.", modes=("lora",), advanced=True, ge=0, lt=1,
        label="Network dropout",
    )
    conv_dim: Optional[int] = setting(
        None, "Rank of LoRA on the 3x3 convolutions too (LoCon); unset: attention only for "
        "lora, network_dim for the LyCORIS types (as lycoris does).",
        modes=("lora",), advanced=True, ge=1, le=1024,
        label="Convolution rank (LoCon)",
    )
    conv_alpha: Optional[float] = setting(
        None, "Alpha of the convolution LoRA; unset uses conv_dim (LyCORIS: network_alpha).",
        modes=("lora",), advanced=True, gt=0, le=4096,
        label="Convolution alpha",
    )
    factor: Optional[int] = setting(
        None, "LoKr only: the Kronecker factor of each dimension; unset: lycoris picks it "
        "(its factor -1).", modes=("lora",), advanced=True, ge=1, le=4096, label="LoKr factor",
    )
    decompose_both: bool = setting(
        False, "LoKr only: factor the smaller Kronecker matrix into low rank too.",
        modes=("lora",), advanced=True, label="LoKr: decompose both",
    )
    use_tucker: bool = setting(
        False, "LyCORIS locon/loha/lokr/dora: Tucker (CP) decomposition of the 3x3 "
        "convolutions' kernels.", modes=("lora",), advanced=True, label="Tucker decomposition",
    )
    use_scalar: bool = setting(
        False, "LyCORIS locon/loha/lokr/dora: a trained scalar on the update (starts at 0).",
        modes=("lora",), advanced=True, label="Trained scalar",
    )
    rank_dropout: Optional[float] = setting(
        None, "LyCORIS locon/loha/lokr/dora: dropout of rank rows of the update.",
        modes=("lora",), advanced=True, ge=0, lt=1, label="Rank dropout",
    )
    module_dropout: Optional[float] = setting(
        None, "LyCORIS types: probability of skipping a module's adapter in a step.",
        modes=("lora",), advanced=True, ge=0, lt=1, label="Module dropout",
    )
    train_norm: bool = setting(
        False, "LyCORIS types: train the norm layers' weights and biases too.",
        modes=("lora",), advanced=True, label="Train norm layers",
    )
    train_unet: bool = setting(True, "Train the UNet.", modes=("lora", "dreambooth"),
                               label="Train the UNet")
    train_text_encoder: bool = setting(
        False, "Train the text encoder too.", modes=("lora", "dreambooth"),
        label="Train the text encoder",
    )
    train_text_encoder_2: Optional[bool] = setting(
        None, "SDXL only: train the second text encoder (OpenCLIP bigG); unset follows "
        "train_text_encoder.", modes=("lora", "dreambooth"), advanced=True,
        label="Train SDXL's second text encoder",
    )
    stop_text_encoder_training: Optional[int] = setting(
        None, "Freeze the text encoder after this many steps (it trains until then).",
        modes=("lora", "dreambooth"), advanced=True, ge=1,
        label="Stop text-encoder training after (steps)",
    )
    token_string: Optional[str] = setting(
        None, "The new token that the embedding learns, e.g. <my-cat>.",
        modes=("textual_inversion",),
        label="Token",
    )
    init_word: Optional[str] = setting(
        None, "Word(s) whose embedding starts the token; with several tokens, vector i starts "
        "from token i (repeated when there are fewer); unset starts from their mean.",
        modes=("textual_inversion",),
        label="Initial word(s)",
    )
    num_vectors_per_token: int = setting(
        1, "Number of embedding vectors for the token.", modes=("textual_inversion",),
        ge=1, le=75,
        label="Vectors per token",
    )
    caption_templates: Optional[Literal["object", "style"]] = setting(
        None, "Train on built-in captions ('a photo of a <token>', ... or 'a painting in the "
        "style of <token>', ...) instead of the dataset's; unset: every caption must hold "
        "the token.", modes=("textual_inversion",),
        label="Built-in caption templates",
    )


# sd-scripts' --optimizer_type spellings; trainer/optim.py builds each.
OptimizerName = Literal[
    "AdamW", "AdamW8bit", "PagedAdamW8bit", "PagedAdamW", "PagedAdamW32bit", "Lion", "Lion8bit",
    "PagedLion8bit", "SGDNesterov", "SGDNesterov8bit", "Adafactor", "Prodigy", "DAdaptAdam",
    "DAdaptation", "DAdaptAdamPreprint", "DAdaptAdaGrad", "DAdaptAdan", "DAdaptAdanIP",
    "DAdaptLion", "DAdaptSGD", "AdamWScheduleFree", "RAdamScheduleFree", "SGDScheduleFree",
]
SchedulerName = Literal[
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
    "cosine_with_min_lr", "inverse_sqrt", "warmup_stable_decay", "piecewise_constant", "adafactor",
]


class OptimizerSection(Section):
    optimizer_type: OptimizerName = setting("AdamW", "Optimizer.", label="Optimizer")
    learning_rate: float = setting(1e-4, "Base learning rate.", gt=0, le=10, label="Learning rate")
    unet_lr: Optional[float] = setting(
        None, "Learning rate of the UNet; unset uses learning_rate.", modes=("lora", "dreambooth"),
        advanced=True, gt=0, le=10,
        label="UNet learning rate",
    )
    text_encoder_lr: Optional[float] = setting(
        None, "Learning rate of the text encoder; unset uses learning_rate.",
        modes=("lora", "dreambooth"), advanced=True, gt=0, le=10,
        label="Text-encoder learning rate",
    )
    text_encoder_2_lr: Optional[float] = setting(
        None, "SDXL only: learning rate of the second text encoder; unset uses "
        "text_encoder_lr.", modes=("lora", "dreambooth"), advanced=True, gt=0, le=10,
        label="Second text-encoder learning rate",
    )
    weight_decay: float = setting(0.01, "Weight decay.", advanced=True, ge=0, le=1,
                                  label="Weight decay")
    optimizer_args: dict[str, Union[bool, int, float, str, list[float]]] = setting(
        {}, "Extra keyword arguments for the optimizer, e.g. {d_coef = 2.0} for Prodigy, "
        "{betas = [0.9, 0.99]}.",
        advanced=True, widget="dict",
        label="Optimizer arguments",
    )
    lr_scheduler: SchedulerName = setting("constant", "Learning-rate schedule.",
                                          label="Learning-rate schedule")
    lr_warmup_steps: int = setting(0, "Warm-up steps at the start of the schedule.", ge=0,
                                   label="Learning-rate warm-up steps")
    lr_scheduler_num_cycles: int = setting(
        1, "Restarts of cosine_with_restarts.", advanced=True, ge=1, le=1000,
        label="Cosine restarts",
    )
    lr_scheduler_power: float = setting(
        1.0, "Power of the polynomial schedule.", advanced=True, gt=0, le=100,
        label="Polynomial power",
    )
    lr_scheduler_args: dict[str, Union[bool, int, float, str]] = setting(
        {}, "Extra keyword arguments for the schedule (sd-scripts' lr_scheduler_args), e.g. "
        "{min_lr_rate = 0.1} for cosine_with_min_lr, {num_decay_steps = 100} for "
        "warmup_stable_decay, {step_rules = '1:100,0.1'} for piecewise_constant.",
        advanced=True, widget="dict", label="Schedule arguments",
    )
    max_grad_norm: float = setting(
        1.0, "Clip gradients to this norm; 0 turns clipping off (as in sd-scripts).", ge=0,
        label="Gradient clipping norm",
    )


class TrainingSection(Section):
    max_train_epochs: Optional[int] = setting(
        None, "Train this many epochs; with neither this nor max_train_steps set, one epoch.",
        ge=1, le=100000,
        label="Epochs",
    )
    max_train_steps: Optional[int] = setting(
        None, "Train this many optimizer steps; when both are set the first reached wins.",
        ge=1, le=10_000_000,
        label="Maximum steps",
    )
    train_batch_size: int = setting(1, "Images per batch.", ge=1, le=1024, label="Batch size")
    gradient_accumulation_steps: int = setting(
        1, "Batches summed into one optimizer step.", advanced=True, ge=1, le=1024,
        label="Gradient accumulation steps",
    )
    num_processes: int = setting(
        1, "Training processes on this machine (DDP through accelerate, one per GPU; gloo on "
        "the CPU). Each trains batch size images per step: the global batch is batch size x "
        "processes (x machines).", advanced=True, ge=1, le=64,
        label="Processes (GPUs)",
    )
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = setting(
        "auto", "Compute precision; auto picks what the device does best.",
        label="Mixed precision",
    )
    full_bf16: bool = setting(
        False, "Keep the trained weights in bf16 too (saves memory; needs bf16 precision).",
        advanced=True,
        label="Full bf16 weights",
    )
    resume: Optional[str] = setting(
        None, "Continue from a saved state: its folder, or 'latest' for the newest complete "
        "state in saving.output_dir.", widget="dir",
        label="Resume from a saved state",
    )
    gradient_checkpointing: bool = setting(
        False, "Recompute activations in the backward pass to save memory.", advanced=True,
        label="Gradient checkpointing",
    )
    compile: Optional[bool] = setting(
        None, "Compile the UNet with torch.compile: the first steps wait for the compiler "
        "(minutes for a full-size model), the later ones may run faster. Unset: off on every "
        "backend (see bench/compile_speed.py for this machine's figures).", advanced=True,
        label="Compile the UNet (torch.compile)",
    )
    seed: int = setting(42, "Random seed.", ge=0, le=2**32 - 1, label="Seed")
    zero_terminal_snr: bool = setting(
        False, "Rescale the noise schedule to zero terminal SNR (Lin et al. 2024); for "
        "v-prediction models. Samples use the same schedule.", advanced=True,
        label="Zero terminal SNR",
    )
    noise_offset: Optional[float] = setting(
        None, "Noise offset (Guttenberg 2023): lets the model learn darker and brighter images.",
        advanced=True, ge=0, le=1,
        label="Noise offset",
    )
    min_snr_gamma: Optional[float] = setting(
        None, "Min-SNR loss weighting gamma (Hang et al. 2023); 5 is the paper's value.",
        advanced=True, gt=0, le=100,
        label="Min-SNR gamma",
    )
    noise_offset_random_strength: bool = setting(
        False, "Draw the noise offset's strength uniformly between 0 and noise_offset for "
        "every batch (sd-scripts' option of the same name).", advanced=True,
        label="Random noise-offset strength",
    )
    adaptive_noise_scale: Optional[float] = setting(
        None, "Add this times the absolute mean of each latent channel to the noise offset "
        "(needs noise_offset; sd-scripts' option of the same name).", advanced=True,
        ge=-1, le=1,
        label="Adaptive noise scale",
    )
    multires_noise_iterations: Optional[int] = setting(
        None, "Multi-resolution (pyramid) noise with this many levels (6-10 is usual; "
        "Whitaker 2023); unset: plain Gaussian noise.", advanced=True, ge=1, le=64,
        label="Multires noise iterations",
    )
    multires_noise_discount: float = setting(
        0.3, "Weight decay per level of the multires noise (only with "
        "multires_noise_iterations).", advanced=True, ge=0, le=1,
        label="Multires noise discount",
    )
    min_timestep: Optional[int] = setting(
        None, "Draw training timesteps from this one up (unset: 0).", advanced=True,
        ge=0, le=999,
        label="Minimum timestep",
    )
    max_timestep: Optional[int] = setting(
        None, "Draw training timesteps below this one (exclusive; unset: the schedule's "
        "length, 1000).", advanced=True, ge=1, le=1000,
        label="Maximum timestep",
    )
    debiased_estimation_loss: bool = setting(
        False, "Weight the loss by 1/sqrt(SNR) (1/(SNR+1) for v-prediction), Yu et al. 2023; "
        "sd-scripts' option of the same name.", advanced=True,
        label="Debiased estimation loss",
    )
    scale_v_pred_loss_like_noise_pred: bool = setting(
        False, "v-prediction only: scale the loss by SNR/(SNR+1) so that it weighs timesteps "
        "like an epsilon-prediction loss.", advanced=True,
        label="Scale v-prediction loss like noise prediction",
    )
    loss_type: Literal["l2", "huber", "smooth_l1", "l1"] = setting(
        "l2", "Loss function: l2 (mean squared error), l1, or the scheduled pseudo-Huber "
        "huber / smooth_l1 (Khrapov & Popov 2024), less sensitive to outliers.", advanced=True,
        label="Loss type",
    )
    huber_schedule: Literal["constant", "exponential", "snr"] = setting(
        "snr", "How the Huber parameter changes with the timestep (huber and smooth_l1 only).",
        advanced=True,
        label="Huber schedule",
    )
    huber_c: float = setting(
        0.1, "Huber parameter c: the constant value, or where the schedules end "
        "(huber and smooth_l1 only).", advanced=True, gt=0, le=1,
        label="Huber c",
    )
    huber_scale: float = setting(
        1.0, "Multiplies the constant and exponential Huber schedules (huber and smooth_l1 "
        "only).", advanced=True, gt=0, le=100,
        label="Huber scale",
    )
    masked_loss: bool = setting(
        False, "Train only where a mask is white: the mask is the image's alpha channel "
        "(dataset.alpha_mask) or an image in dataset.mask_data_dir.", advanced=True,
        label="Masked loss",
    )
    prior_loss_weight: float = setting(
        1.0, "Weight of the regularization images' loss.", modes=("lora", "dreambooth"),
        advanced=True, ge=0, le=100,
        label="Prior-preservation loss weight",
    )
    log_with: Literal["none", "tensorboard"] = setting(
        "tensorboard", "Write training logs for TensorBoard into logging_dir.", advanced=True,
        label="Logging",
    )
    logging_dir: Optional[str] = setting(
        None, "Folder of the TensorBoard logs; unset uses logs inside output_dir.",
        advanced=True, widget="dir",
        label="Log folder",
    )
    validate_every_n_steps: Optional[int] = setting(
        None, "Measure the validation loss every N steps (at fixed timesteps and noise, so the "
        "values compare); unset: at the end of every epoch.", advanced=True, ge=1,
        label="Validate every N steps",
    )


class SamplingSection(Section):
    sample_prompts: list[str] = setting(
        [], "Prompts of the sample images, one per line.", widget="list",
        label="Sample prompts",
    )
    sample_every_n_steps: Optional[int] = setting(
        None, "Make sample images every N steps.", ge=1,
        label="Sample every N steps",
    )
    sample_every_n_epochs: Optional[int] = setting(
        None, "Make sample images every N epochs.", ge=1,
        label="Sample every N epochs",
    )
    sample_sampler: Literal["ddim", "euler", "euler_a", "dpmsolver++"] = setting(
        "euler_a", "Sampler of the sample images.", advanced=True,
        label="Sampler",
    )
    sample_steps: int = setting(20, "Denoising steps per sample image.", advanced=True, ge=1,
                                le=1000, label="Sampling steps")
    sample_guidance_scale: float = setting(
        7.0, "Classifier-free guidance scale of the samples.", advanced=True, ge=0, le=50,
        label="Guidance scale (CFG)",
    )
    sample_seed: int = setting(0, "Seed of the sample images.", advanced=True, ge=0,
                               le=2**32 - 1, label="Sample seed")


class SavingSection(Section):
    output_dir: str = setting("output", "Folder that receives the trained files.", widget="dir",
                              label="Output folder")
    output_name: str = setting(
        "last", "File name (without extension) of the trained files.",
        pattern=r"^[^/\\:*?\"<>|]+$", min_length=1, max_length=200,
        label="Output name",
    )
    save_precision: Literal["fp32", "fp16", "bf16"] = setting(
        "fp16", "Precision of the saved weights.",
        label="Save precision",
    )
    save_every_n_epochs: Optional[int] = setting(
        None, "Also save <name>-<epoch>.safetensors every N epochs.", ge=1,
        label="Save every N epochs",
    )
    save_every_n_steps: Optional[int] = setting(
        None, "Also save <name>-step<step>.safetensors every N steps.", advanced=True, ge=1,
        label="Save every N steps",
    )
    save_state: bool = setting(
        False, "Also save the training state (<name>-step<N>-state/) with every save, on Stop "
        "and at the end, so that training.resume can continue the run exactly.",
        label="Save the training state",
    )
    intermediate_diffusers: bool = setting(
        False, "Intermediate saves also write a diffusers folder (the final save always does).",
        modes=("dreambooth",), advanced=True,
        label="Intermediate diffusers folders",
    )
    metadata_title: Optional[str] = setting(None, "Title in the file's metadata.", advanced=True,
                                            label="Title")
    metadata_author: Optional[str] = setting(
        None, "Author in the file's metadata.", advanced=True,
        label="Author",
    )
    metadata_description: Optional[str] = setting(
        None, "Description in the file's metadata.", advanced=True, widget="textarea",
        label="Description",
    )
    metadata_license: Optional[str] = setting(
        None, "License in the file's metadata.", advanced=True,
        label="License",
    )


SECTIONS: dict[str, type[Section]] = {
    "model": ModelSection,
    "dataset": DatasetSection,
    "network": NetworkSection,
    "optimizer": OptimizerSection,
    "training": TrainingSection,
    "sampling": SamplingSection,
    "saving": SavingSection,
}


class TrainConfig(BaseModel):
    """A whole training job."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    schema_version: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    mode: Mode = setting("lora", "What is trained: a LoRA, the whole model, or an embedding.",
                         label="Training mode")
    model: ModelSection = Field(default_factory=ModelSection)
    dataset: DatasetSection = Field(default_factory=DatasetSection)
    network: NetworkSection = Field(default_factory=NetworkSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    saving: SavingSection = Field(default_factory=SavingSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        ds = self.dataset
        if ds.min_bucket_reso > ds.max_bucket_reso:
            raise ValueError(
                f"dataset.min_bucket_reso ({ds.min_bucket_reso}) is larger than "
                f"dataset.max_bucket_reso ({ds.max_bucket_reso})"
            )
        if self.network.conv_alpha is not None and self.network.conv_dim is None:
            raise ValueError("network.conv_alpha is set but network.conv_dim is not: set both")
        from trainer.config_rules import mode_checks

        mode_checks(self)
        return self


def iter_fields() -> list[tuple[str, str, Any]]:
    """(section, name, FieldInfo) of every setting, in declaration order; section '' is top."""
    out: list[tuple[str, str, Any]] = [("", "mode", TrainConfig.model_fields["mode"])]
    for section, cls in SECTIONS.items():
        for name, info in cls.model_fields.items():
            out.append((section, name, info))
    return out


def ui_hints(info: Any) -> dict[str, Any]:
    """The UI hints (modes, advanced, widget) of a field."""
    extra = info.json_schema_extra or {}
    return dict(extra.get("ui", {"modes": list(MODES), "advanced": False}))
