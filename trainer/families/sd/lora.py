"""SD 1.x and 2.x LoRA files as sd-scripts writes them: kohya's names on diffusers' module
paths (``lora_unet_down_blocks_...``), the text encoder as ``lora_te_...``, and the version
strings of the metadata (``ss_base_model_version``, ``modelspec.architecture``). SDXL's
(``trainer/families/sdxl/lora.py``) answers the same questions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from trainer.families import spec

# the kohya prefix of each text encoder's modules
TE_PREFIXES = {"text_encoder": "lora_te"}
# whether the UNet's kohya names and ``modelspec.implementation`` follow Stability's
# generative-models layout (SDXL) rather than diffusers'
SGM_LAYOUT = False


def unet_rename(unet: Any) -> Optional[Callable[[str], str]]:
    """diffusers module path -> the path kohya names (None: the diffusers path itself)."""
    return None


def base_model_version(name: str, v_prediction: bool) -> str:
    """sd-scripts' ``ss_base_model_version``: ``sd_v1``, ``sd_v2``, ``sd_v2_v`` (``sd_v1_v``)."""
    return spec(name).kohya_version + ("_v" if v_prediction else "")


def modelspec_architecture(name: str, v_prediction: bool) -> str:
    """``stable-diffusion-v1``, ``-v2-512``, ``-v2-768-v`` (without the adapter)."""
    if name == "sd2":
        return "stable-diffusion-v2-768-v" if v_prediction else "stable-diffusion-v2-512"
    return "stable-diffusion-v1"


def is_v2(name: str) -> bool:
    """sd-scripts' ``ss_v2``."""
    return name == "sd2"
