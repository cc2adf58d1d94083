"""SDXL: a larger UNet, CLIP ViT-L beside OpenCLIP ViT-bigG (pooled text and size
conditioning), the DDPM objective. Its roles extend SD 1.x's (``trainer/families/sd``)."""

from trainer.families.spec import FamilySpec, Variant

SDXL = FamilySpec(
    name="sdxl", label="SDXL", folder="sdxl", denoiser="unet", objective="ddpm",
    text_encoders=("clip_l", "clip_g"), embedded="embedded:tiny-sdxl",
    pipelines=("StableDiffusionXLPipeline",), variants=(Variant("base", "SDXL base", "sdxl"),),
    kohya_version="sdxl_base_v1-0")
SPECS = (SDXL,)
