"""FLUX.1 (dev, schnell): Black Forest Labs' MMDiT transformer with CLIP-L and T5-XXL, the
16-channel autoencoder, flow matching with distilled guidance (dev).

FLUX.1 Kontext [dev] is the same transformer (the same keys and shapes as FLUX.1-dev, so a
single file cannot tell them apart: ``model.model_version = "flux1_kontext"`` says which, a
diffusers folder's ``FluxKontextPipeline`` says it itself) trained to read a reference image:
its latents, packed as the target's, follow the target's tokens with position ids whose first
coordinate is 1 (diffusers' ``FluxKontextPipeline``, BFL's ``flux/sampling.py``). A target
without a reference trains as FLUX.1-dev's text-to-image (as diffusers' and ai-toolkit's
Kontext trainers allow; musubi-tuner requires one); the reference is resized to about the
1024 x 1024 area of BFL's preferred Kontext resolutions at its own aspect, sides on multiples
of 16 (the pipeline's ``_auto_resize``).
"""

from trainer.families.spec import ControlSpec, FamilySpec, Variant

FLUX1 = FamilySpec(
    name="flux1", label="FLUX.1", folder="flux", denoiser="transformer", objective="flow",
    text_encoders=("clip_l", "t5xxl"), embedded="embedded:tiny-flux",
    pipelines=("FluxPipeline",),
    variants=(Variant("dev", "FLUX.1-dev, guidance-distilled", "flux1-dev", 512),
              Variant("schnell", "FLUX.1-schnell", "flux1-schnell", 256)),
    part_settings={"vae": "model.ae", "clip_l": "model.clip_l", "t5xxl": "model.t5xxl"},
    kohya_version="flux1", textual_inversion=False)
KONTEXT_AREA = 1024 * 1024  # BFL's preferred Kontext resolutions: (672, 1568) ... (1568, 672)
FLUX1_KONTEXT = FamilySpec(
    name="flux1_kontext", label="FLUX.1 Kontext", folder="flux", denoiser="transformer",
    objective="flow", text_encoders=("clip_l", "t5xxl"), embedded="embedded:tiny-flux-kontext",
    pipelines=("FluxKontextPipeline",),
    variants=(Variant("dev", "FLUX.1 Kontext [dev]", "flux1-dev", 512),),
    part_settings={"vae": "model.ae", "clip_l": "model.clip_l", "t5xxl": "model.t5xxl"},
    kohya_version="flux1", textual_inversion=False,
    controls=ControlSpec(max=1, required=0, area=KONTEXT_AREA, multiple=16))
SPECS = (FLUX1, FLUX1_KONTEXT)
KONTEXT = FLUX1_KONTEXT.name
