"""FLUX.2 (klein 4B / 9B, dev): Black Forest Labs' 2025 MMDiT with shared modulation, the
32-channel autoencoder whose latents are patchified 2x2 to 128 channels and normalized with its
BatchNorm statistics, and flow matching. klein reads stacked Qwen3 hidden states (no guidance
embedder); dev reads Mistral-Small-3's (with a guidance embedder). Both read reference images
(edit training's controls, optional: trainer/families/flux2/references.py): each at its own
size up to about 1024 x 1024, its tokens after the target's."""

from trainer.families.spec import ControlSpec, FamilySpec, Variant

# the references as the pipelines take them (trainer/families/flux2/references.py): up to 10
# (Black Forest Labs' count; the pipelines set none), each at its own size, scaled down to
# about 1024 x 1024 pixels when larger, sides cut to multiples of 16
MAX_REFERENCES = 10
REFERENCE_AREA = 1024 * 1024
MULTIPLE = 16  # the VAE's 8 x the 2x2 latent patches

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
    kohya_version="flux2", textual_inversion=False,
    controls=ControlSpec(max=MAX_REFERENCES, required=0, area=REFERENCE_AREA,
                         multiple=MULTIPLE, shrink_only=True, min_side=64, max_aspect=8.0))
SPECS = (FLUX2,)
