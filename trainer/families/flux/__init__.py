"""FLUX.1 (dev, schnell): Black Forest Labs' MMDiT transformer with CLIP-L and T5-XXL, the
16-channel autoencoder, flow matching with distilled guidance (dev)."""

from trainer.families.spec import FamilySpec, Variant

FLUX1 = FamilySpec(
    name="flux1", label="FLUX.1", folder="flux", denoiser="transformer", objective="flow",
    text_encoders=("clip_l", "t5xxl"), embedded="embedded:tiny-flux",
    pipelines=("FluxPipeline",), train_blocks=("all", "single", "double"),
    variants=(Variant("dev", "FLUX.1-dev, guidance-distilled", "flux1-dev", 512),
              Variant("schnell", "FLUX.1-schnell", "flux1-schnell", 256)),
    part_settings={"vae": "model.ae", "clip_l": "model.clip_l", "t5xxl": "model.t5xxl"},
    kohya_version="flux1", textual_inversion=False)
SPECS = (FLUX1,)
