"""Z-Image (Turbo, Base): Tongyi-MAI's 6B single-stream DiT with the Qwen3-4B text encoder, the
FLUX.1 autoencoder (16 channels), flow matching with the static shift of its scheduler."""

from trainer.families.spec import FamilySpec, Variant

ZIMAGE = FamilySpec(
    name="zimage", label="Z-Image", folder="zimage", denoiser="transformer", objective="flow",
    text_encoders=("qwen3",), embedded="embedded:tiny-zimage",
    pipelines=("ZImagePipeline",),
    # the main layers (musubi-tuner's, ai-toolkit's), or with the refiners (diffusers' example)
    train_blocks=("all", "with_refiners"),
    variants=(Variant("turbo", "Z-Image Turbo", "z-image-turbo"),
              Variant("base", "Z-Image", "z-image-turbo")),
    part_settings={"vae": "model.ae", "qwen3": "model.text_encoder"},
    kohya_version="zimage", textual_inversion=False, continues_lora=True)
SPECS = (ZIMAGE,)
