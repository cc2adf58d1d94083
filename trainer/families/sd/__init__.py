"""SD 1.x and SD 2.x: a UNet, one CLIP text encoder (ViT-L for 1.x, OpenCLIP ViT-H for 2.x),
the DDPM objective with epsilon or v prediction. SDXL (``trainer/families/sdxl``) extends it."""

from trainer.families.spec import FamilySpec, Variant

SD1 = FamilySpec(
    name="sd1", label="SD 1.x", folder="sd", denoiser="unet", objective="ddpm",
    text_encoders=("clip_l",), embedded="embedded:tiny-sd15",
    pipelines=("StableDiffusionPipeline",), variants=(Variant("v1", "SD 1.x", "sd1"),),
    kohya_version="sd_v1")
SD2 = FamilySpec(
    name="sd2", label="SD 2.x", folder="sd", denoiser="unet", objective="ddpm",
    text_encoders=("open_clip",), pipelines=("StableDiffusionPipeline",),
    variants=(Variant("768-v", "SD 2.x 768-v", "sd2-768-v"),
              Variant("512", "SD 2.x 512", "sd2-512")),
    kohya_version="sd_v2")
SPECS = (SD1, SD2)
