"""[sampling] and [saving]: what a run writes."""

from __future__ import annotations

from typing import Literal, Optional

from trainer.config.sections.base import Section, setting


class SamplingSection(Section):
    sample_prompts: list[str] = setting(
        [], "Prompts of the sample images, one per line; a line may end in sd-scripts' "
        "options: --n negative prompt, --w / --h size, --d seed, --l guidance scale, --s "
        "steps, --ss sampler.", widget="list",
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
        "same samplers); a prompt's --ss overrides it.", advanced=True,
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
