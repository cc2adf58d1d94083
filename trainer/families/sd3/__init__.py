"""SD 3 and 3.5 (medium, large): Stability's MMDiT with CLIP-L, CLIP-G and T5-XXL, a
16-channel VAE, flow matching."""

from trainer.families.spec import FamilySpec, Variant

SD3 = FamilySpec(
    name="sd3", label="SD 3.5", folder="sd3", denoiser="transformer", objective="flow",
    text_encoders=("clip_l", "clip_g", "t5xxl"), embedded="embedded:tiny-sd3",
    pipelines=("StableDiffusion3Pipeline",),
    variants=(Variant("5-large", "SD 3.5 large", "sd35-large", 256),
              Variant("5-medium", "SD 3.5 medium", "sd35-medium", 256),
              Variant("medium", "SD 3 medium", "sd3-medium", 256)),
    part_settings={"vae": "model.vae", "clip_l": "model.clip_l", "clip_g": "model.clip_g",
                   "t5xxl": "model.t5xxl"},
    kohya_version="sd3", textual_inversion=False)
SPECS = (SD3,)
