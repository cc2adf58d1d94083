"""[sampling] and [saving]: what a run writes."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import model_validator

from trainer.config.sections.base import DDPM, Section, setting
from trainer.config.sections.ema import SavingEMA
from trainer.config.sections.hub import HubUpload


class SamplingSection(Section):
    sample_prompts: list[str] = setting(
        [], "Prompts of the sample images, one per line; a line may end in sd-scripts' "
        "options: --n negative prompt, --w / --h size, --d seed, --l guidance scale, --s "
        "steps, --ss sampler, and for an edit model --ci a control image's path (once per "
        "control: FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2; shown beside the sample).",
        widget="list",
        label="Sample prompts",
    )
    sample_prompts_file: Optional[str] = setting(
        None, "An sd-scripts prompt file (.txt with a prompt per line, .toml with "
        "[[prompt.subset]], .json), read at each sampling, after sample_prompts.",
        advanced=True, widget="file",
        label="Sample prompts file",
    )
    sample_every_n_steps: Optional[int] = setting(
        None, "Make sample images every N steps.", ge=1,
        label="Sample every N steps",
    )
    sample_every_n_epochs: Optional[int] = setting(
        None, "Make sample images every N epochs.", ge=1,
        label="Sample every N epochs",
    )
    sample_sampler: Literal["ddim", "pndm", "lms", "euler", "euler_a", "heun", "dpm_2",
                            "dpm_2_a", "dpmsolver", "dpmsolver++", "dpmsingle"] = setting(
        "euler_a", "Sampler of the sample images (sd-scripts' names; k_euler etc. are the "
        "same samplers); a prompt's --ss overrides it. The flow families sample with their "
        "pipeline's flow-matching scheduler.", advanced=True, families=DDPM,
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


class SavingSection(SavingEMA, HubUpload):
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
    save_last_n_epochs: Optional[int] = setting(
        None, "Keep only the last N of the saves every N epochs: an older <name>-<epoch> "
        "file is deleted once the newer one is complete on disk (sd-scripts' "
        "save_last_n_epochs). Needs save_every_n_epochs.", advanced=True, ge=1,
        label="Keep the last N epoch saves",
    )
    save_last_n_epochs_state: Optional[int] = setting(
        None, "Keep only the training states of the last N epoch saves (unset: "
        "save_last_n_epochs). Needs save_state and save_every_n_epochs.", advanced=True, ge=1,
        label="Keep the last N epoch states",
    )
    save_last_n_steps: Optional[int] = setting(
        None, "Keep only the step saves of the last N steps (a number of steps, not of "
        "files, as sd-scripts' save_last_n_steps): older <name>-step<N> files are deleted "
        "once the newer one is complete. Needs save_every_n_steps.", advanced=True, ge=1,
        label="Keep the step saves of the last N steps",
    )
    save_last_n_steps_state: Optional[int] = setting(
        None, "Keep only the training states of the last N steps' step saves (unset: "
        "save_last_n_steps). Needs save_state and save_every_n_steps.", advanced=True, ge=1,
        label="Keep the step states of the last N steps",
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
    training_comment: Optional[str] = setting(
        None, "A comment written into the saved file's metadata (ss_training_comment, as "
        "sd-scripts' --training_comment).", advanced=True,
        label="Training comment",
    )
    metadata_tags: Optional[str] = setting(
        None, "Comma-separated tags of the model, in the saved file's metadata "
        "(modelspec.tags, as sd-scripts' --metadata_tags).", advanced=True,
        label="Metadata tags",
    )

    @model_validator(mode="after")
    def _keep_last(self):
        """The keep-last-N settings count the saves of one schedule; without it (or without
        save_state for the states) they would never delete anything."""
        needs = {"save_last_n_epochs": ["save_every_n_epochs"],
                 "save_last_n_epochs_state": ["save_every_n_epochs", "save_state"],
                 "save_last_n_steps": ["save_every_n_steps"],
                 "save_last_n_steps_state": ["save_every_n_steps", "save_state"]}
        for key, required in needs.items():
            missing = [r for r in required if getattr(self, key) is not None
                       and getattr(self, r) in (None, False)]
            if missing:
                raise ValueError(f"saving.{key} keeps the last saves of saving.{required[0]}; "
                                 f"set saving.{missing[0]} too, or unset it")
        return self
