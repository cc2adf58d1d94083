"""Chroma (lodestones; Chroma1-HD, Chroma1-Base): FLUX.1-schnell's transformer with the
per-block modulations replaced by one modulation approximator (``distilled_guidance_layer``), T5-XXL
alone (no CLIP-L), T5's padding masked as its pipeline does, FLUX.1's 16-channel autoencoder,
flow matching without distilled guidance (true CFG at inference)."""

from trainer.families.spec import FamilySpec, Variant

CHROMA = FamilySpec(
    name="chroma", label="Chroma", folder="chroma", denoiser="transformer", objective="flow",
    text_encoders=("t5xxl",), embedded="embedded:tiny-chroma", pipelines=("ChromaPipeline",),
    continues_lora=True,  # network_weights: its lora role reads its and the peers' files
    train_blocks=("all", "single", "double"),
    # HD and Base have the same keys and shapes: one variant, which names the released model
    variants=(Variant("hd", "Chroma1-HD", "chroma1-hd", 512),),
    part_settings={"vae": "model.ae", "t5xxl": "model.t5xxl"},
    kohya_version="chroma", textual_inversion=False)
SPECS = (CHROMA,)
