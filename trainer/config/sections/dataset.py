"""[dataset]: images, captions, buckets and caches."""

from __future__ import annotations

from typing import Optional

from pydantic import field_validator, model_validator

from trainer.config.sections.base import EDIT, EMBEDDED_DATASET, setting
from trainer.config.sections.captions import CaptionOptions
from trainer.config.sections.resolution import Resolution, check_resolution


class DatasetSection(CaptionOptions):
    train_data_dir: str = setting(
        EMBEDDED_DATASET,
        "Folder of N_concept subfolders (N = repeats) with images and caption files.",
        widget="dir",
        label="Training images folder",
    )
    dataset_repeats: Optional[int] = setting(
        None, "Repeats per epoch of the images placed directly in train_data_dir, beside its "
        "N_concept subfolders (kohya_ss's finetune layout, sd-scripts' --dataset_repeats); "
        "also the num_repeats of dataset_config subsets that set none. Unset: such images are "
        "not trained.", advanced=True, ge=1, le=100_000,
        label="Repeats of images directly in the folder",
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
    resolution: Resolution = setting(
        512, "Training resolution in pixels: one side (a square base) or [width, height] "
        "(kohya_ss's \"512,768\"); the buckets keep the base's area, sides 64-4096 on "
        "multiples of 8.", widget="size",
        label="Resolution",
    )
    _resolution = field_validator("resolution", mode="before")(check_resolution)
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
    color_aug: bool = setting(
        False, "Colour augmentation as sd-scripts' --color_aug does it: a third of the samples "
        "get a hue shift of up to 16 degrees or a gamma of 0.95-1.05, drawn every step; the "
        "pixels change, so dataset.cache_latents must be off.", advanced=True,
        label="Colour augmentation",
    )
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
    control_dir: Optional[str] = setting(
        None, "Edit training: folder of the control (reference) images, each named like its "
        "training image (10_night/001.png -> 001.png; several references 001_0.png, 001_1.png, "
        "in that order), directly inside or in subfolders named like the concept folders; a "
        "relative path is read from train_data_dir. Only for models that take control images.",
        advanced=True, widget="dir", families=EDIT,
        label="Control images folder",
    )
    control_resolution: Optional[int] = setting(
        None, "Edit training: resize each control image to about this side squared at its own "
        "aspect (musubi-tuner's control_resolution; a dataset TOML subset's own wins). Unset: "
        "as the model's pipeline sizes its references (FLUX.1 Kontext: BFL's preferred "
        "resolution nearest the aspect, about 1024 x 1024; FLUX.2: its own size, scaled down "
        "to about 1024 x 1024 when larger).", advanced=True, ge=16, le=8192,
        families=EDIT, label="Control image resolution",
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
    enable_wildcard: bool = setting(
        False, "Wildcard captions, as sd-scripts' --enable_wildcard: {a|b|c} in a caption (or "
        "the prefix or suffix) trains as one of its options, drawn at each step, and a "
        "caption file of several lines as one of its lines ({{ and }} are literal braces). "
        "Off: the first line, as written.", advanced=True,
        label="Wildcard captions",
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
    cache_text_encoder_outputs_to_disk: bool = setting(
        False, "Keep the text-encoder outputs on disk too (one file per caption in the latent "
        "cache folder), reused by the next run with the same captions and text encoders: "
        "FLUX.1's and SD 3.5's T5 is the slow part of their start (sd-scripts' option of the "
        "same name).", advanced=True,
        label="Cache text-encoder outputs on disk",
    )

    @model_validator(mode="after")
    def _text_cache_on_disk(self) -> DatasetSection:
        if self.cache_text_encoder_outputs_to_disk and self.cache_text_encoder_outputs is False:
            raise ValueError("dataset.cache_text_encoder_outputs_to_disk is on but "
                             "dataset.cache_text_encoder_outputs is off: there would be nothing "
                             "to keep; turn one of them around")
        return self
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
