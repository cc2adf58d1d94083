"""Qwen-Image-Edit's conditioning (diffusers' ``QwenImageEditPipeline`` and, for 2509 and 2511,
``QwenImageEditPlusPipeline``): the control (reference) images enter twice.

- **The text**: Qwen2.5-VL reads the prompt inside the edit template, whose user turn holds the
  image (``<|vision_start|><|image_pad|><|vision_end|>``, one per control, each after
  ``Picture N: `` in the Plus template), through the processor (``Qwen2VLProcessor``: the image
  tower's patches, the pad token repeated per merged patch); the hidden states of the real
  tokens without the template's first 64. Edit passes the control at the size its latents have
  (the pipeline resizes it once, to about 1024 x 1024); Plus resizes it to about 384 x 384
  (``CONDITION_IMAGE_SIZE``, sides on multiples of 32) for the text encoder alone. So the
  text conditioning of an edit pair depends on its controls, and the family's spec says so
  (``ControlSpec.text``): the text cache keys each row by its caption and its controls as
  rendered (trainer/data/control_batch.py; musubi-tuner caches per item with its control
  images, resized to 384 x 384 for every variant, where this follows each pipeline), and
  without a cache each step encodes its captions with its controls' pixels.
- **The latents**: each control's VAE latents, packed into 2x2 patches like the target's and
  concatenated after the target's tokens, each with its own ``img_shapes`` entry; the output is
  cut back to the target's tokens, so the loss is on the target alone. 2511's transformer
  (``zero_cond_t``) gives the reference tokens the zero timestep itself.

No image processor ships in a ComfyUI file, and transformers' ``Qwen2VLProcessor`` needs
torchvision for its video part, which an image edit never reads: :func:`edit_processor` builds it
with the image part alone (the PIL image processor)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.models.text_conditioning import TextConditioning

SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, "
          "size, texture, objects, background), then explain how the user's text instruction "
          "should alter or modify the image. Generate a new image that meets the user's "
          "requirements while maintaining consistency with the original input where "
          "appropriate.<|im_end|>\n<|im_start|>user\n")
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
EDIT_TEMPLATE = SYSTEM + IMAGE + "{}<|im_end|>\n<|im_start|>assistant\n"
PLUS_TEMPLATE = SYSTEM + "{}<|im_end|>\n<|im_start|>assistant\n"
PICTURE = "Picture {}: " + IMAGE
DROP = 64  # prompt_template_encode_start_idx of both edit pipelines
CONDITION_AREA = 384 * 384  # QwenImageEditPlusPipeline's CONDITION_IMAGE_SIZE
# how many controls each variant takes (at least one: an edit model edits an image)
MAX_CONTROLS = {"base": 0, "layered": 0, "edit": 1, "edit-2509": 3, "edit-2511": 3}
# the diffusers pipeline of each edit variant's folder
PIPELINES = {"edit": "QwenImageEditPipeline", "edit-2509": "QwenImageEditPlusPipeline",
             "edit-2511": "QwenImageEditPlusPipeline"}


def is_edit(variant: str) -> bool:
    return MAX_CONTROLS.get(variant, 0) > 0


# musubi-tuner's modelspec architectures of the edit models (utils/sai_model_spec.py: Edit,
# Edit-Plus for 2509, Edit-2511), in the lower case of this studio's "qwen-image"
ARCHITECTURES = {"edit": "qwen-image-edit", "edit-2509": "qwen-image-edit-plus",
                 "edit-2511": "qwen-image-edit-2511"}


def variant_metadata(variant: str) -> dict[str, str]:
    """An edit model's LoRA metadata over the family's (``modelspec.architecture``)."""
    arch = ARCHITECTURES.get(variant)
    return {"modelspec.architecture": f"{arch}/lora"} if arch else {}


def control_problem(variant: str, label: str, count: int) -> Optional[str]:
    """Why ``count`` controls a training image cannot train ``variant``; None if they can."""
    most = MAX_CONTROLS.get(variant, 0)
    if most == 0 and count:
        return (f"dataset.control_dir: {label} is not an edit model (it takes no control "
                f"images); load Qwen-Image-Edit, -2509 or -2511, or unset it (an Edit or "
                f"2509 single file has Qwen-Image's keys: set model.model_version to "
                f"'qwen_image_edit' or 'qwen_image_edit_2509')")
    if most and not count:
        return (f"{label} edits an image: each training image needs its control image (set "
                f"dataset.control_dir to a folder of them, named like the training images)")
    if count > most:
        return (f"dataset.control_dir: {label} takes at most {most} control image(s) per "
                f"training image, one has {count}; remove the extra ones (2509 and 2511 take "
                f"up to 3)")
    return None


def check_controls(variant: str, label: str, count: int) -> None:
    """Refuse a number of controls the variant cannot take, naming the setting."""
    problem = control_problem(variant, label, count)
    if problem:
        raise ValueError(problem)


def edit_processor(tokenizer: Any, image_processor: Any) -> Any:
    """A ``Qwen2VLProcessor`` with its image part only (no video processor, so no torchvision):
    what the edit pipelines call as ``self.processor``."""
    from transformers import Qwen2VLProcessor

    class ImageProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template,
                             **kwargs)

    return ImageProcessor(image_processor=image_processor, tokenizer=tokenizer)


def load_processor(folder: Path, tokenizer: Any, where: str = "") -> Any:
    """The processor whose image part is in ``folder`` (its ``preprocessor_config.json``: an
    edit pipeline folder's ``processor/``), over the pipeline's tokenizer; ``where`` names
    the folder's origin in the error of one that does not read."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from trainer.families.spec import ModelLoadError

    try:
        image = Qwen2VLImageProcessorPil.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"cannot read the Qwen2.5-VL image processor in {folder}"
                             f"{f' ({where})' if where else ''}: {exc}") from None
    return edit_processor(tokenizer, image)


def to_pil(pixels: torch.Tensor) -> Any:
    """[3, H, W] in [-1, 1] -> the RGB image (exact for pixels that came from 8-bit ones)."""
    from PIL import Image

    rgb = ((pixels.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return Image.fromarray(rgb.permute(1, 2, 0).numpy())


def condition_size(width: int, height: int, area: int = CONDITION_AREA) -> tuple[int, int]:
    """The Plus pipeline's ``calculate_dimensions``: about ``area`` at the image's aspect,
    sides rounded to multiples of 32."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    return round(w / 32) * 32, round(w / ratio / 32) * 32


def text_images(variant: str, controls: list[torch.Tensor]) -> list[list[Any]]:
    """Each row's control images as the variant's text encoder reads them."""
    from diffusers.image_processor import VaeImageProcessor

    resize = VaeImageProcessor(vae_scale_factor=16).resize
    rows = []
    for b in range(controls[0].shape[0]):
        images = [to_pil(c[b]) for c in controls]
        if variant != "edit":
            images = [resize(im, *reversed(condition_size(*im.size))) for im in images]
        rows.append(images)
    return rows


def encode_edit(model: Any, captions: list[str], controls: list[torch.Tensor]
                ) -> TextConditioning:
    """The edit pipelines' ``encode_prompt`` of ``captions`` with their rows' ``controls``
    (one [B, 3, H, W] tensor in [-1, 1] per reference index)."""
    variant, encoder = model.variant, model.text_encoder
    rows = text_images(variant, controls)
    if variant == "edit":
        texts = [EDIT_TEMPLATE.format(c) for c in captions]
    else:
        pictures = "".join(PICTURE.format(i + 1) for i in range(len(controls)))
        texts = [PLUS_TEMPLATE.format(pictures + c) for c in captions]
    inputs = model.processor(text=texts, images=[im for row in rows for im in row],
                             padding=True, return_tensors="pt").to(encoder.device)
    out = encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                  pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                  output_hidden_states=True)
    hidden = out.hidden_states[-1]
    return TextConditioning.padded([h[m.bool()][DROP:]
                                    for h, m in zip(hidden, inputs["attention_mask"])])


def pack_with_controls(noisy: torch.Tensor, controls: list[torch.Tensor]
                       ) -> tuple[torch.Tensor, list[list[tuple[int, int, int]]], int]:
    """(the target's packed tokens followed by each control's, the rows' ``img_shapes``, the
    target's token count)."""
    from diffusers import QwenImagePipeline

    b = noisy.shape[0]
    latents = [noisy, *(c.to(noisy.dtype) for c in controls)]
    packed = [QwenImagePipeline._pack_latents(x, b, x.shape[1], x.shape[2], x.shape[3])
              for x in latents]
    shapes = [(1, x.shape[2] // 2, x.shape[3] // 2) for x in latents]
    return torch.cat(packed, dim=1), [shapes] * b, packed[0].shape[1]
