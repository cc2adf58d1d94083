"""SDXL LoRA files as sd-scripts writes them: the UNet's modules under their names in
Stability's layout (``lora_unet_input_blocks_4_1_...``), the two text encoders as
``lora_te1_`` and ``lora_te2_``, and SDXL's version strings. The same questions as SD 1.x's
(``trainer/families/sd/lora.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from trainer.families import spec

TE_PREFIXES = {"text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}
SGM_LAYOUT = True


def unet_rename(unet: Any) -> Optional[Callable[[str], str]]:
    """diffusers module path -> the original (SGM) one, as kohya names SDXL's modules."""
    from trainer.export.lora import sgm_unet_names

    return sgm_unet_names(unet)


def base_model_version(name: str, v_prediction: bool) -> str:
    """``sdxl_base_v1-0`` (sd-scripts' MODEL_VERSION_SDXL_BASE_V1_0)."""
    return spec(name).kohya_version


def modelspec_architecture(name: str, v_prediction: bool) -> str:
    return "stable-diffusion-xl-v1-base"


def is_v2(name: str) -> bool:
    return False
