"""FLUX.2 (klein 4B / 9B, dev): Black Forest Labs' 2025 MMDiT with shared modulation, the
32-channel autoencoder whose latents are patchified 2x2 to 128 channels and normalized with its
BatchNorm statistics, and flow matching. klein reads stacked Qwen3 hidden states (no guidance
embedder); dev reads Mistral-Small-3's (with a guidance embedder)."""

from trainer.families.spec import FamilySpec, Variant

FLUX2 = FamilySpec(
    name="flux2", label="FLUX.2", folder="flux2", denoiser="transformer", objective="flow",
    text_encoders=("qwen3",), embedded="embedded:tiny-flux2",
    more_twins=("embedded:tiny-flux2-dev",),
    pipelines=("Flux2KleinPipeline", "Flux2Pipeline"),
    continues_lora=True,  # network_weights: its lora role reads its and the peers' files
    train_blocks=("all", "single", "double"),
    variants=(Variant("klein-4b", "FLUX.2 [klein] 4B", "flux2-klein-4b"),
              Variant("klein-9b", "FLUX.2 [klein] 9B", "flux2-klein-9b"),
              Variant("klein-base-4b", "FLUX.2 [klein] base 4B", "flux2-klein-4b"),
              Variant("klein-base-9b", "FLUX.2 [klein] base 9B", "flux2-klein-9b"),
              Variant("dev", "FLUX.2 [dev]", "flux2-dev")),
    part_settings={"vae": "model.ae", "qwen3": "model.text_encoder"},
    kohya_version="flux2", textual_inversion=False)
SPECS = (FLUX2,)
