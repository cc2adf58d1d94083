"""FLUX.1 (dev, schnell): Black Forest Labs' MMDiT transformer with CLIP-L and T5-XXL, the
16-channel autoencoder, flow matching with distilled guidance (dev).

FLUX.1 Kontext [dev] is the same transformer (the same keys and shapes as FLUX.1-dev, so a
single file cannot tell them apart: ``model.model_version = "flux1_kontext"`` says which, a
diffusers folder's ``FluxKontextPipeline`` says it itself) trained to read a reference image:
its latents, packed as the target's, follow the target's tokens with position ids whose first
coordinate is 1 (diffusers' ``FluxKontextPipeline``, BFL's ``flux/sampling.py``). A target
without a reference trains as FLUX.1-dev's text-to-image (as diffusers' and ai-toolkit's
Kontext trainers allow; musubi-tuner requires one); the reference is resized to the one of
BFL's preferred Kontext resolutions nearest its aspect, as the pipeline does at inference
(``_auto_resize``; musubi-tuner trains so too); a dataset TOML's ``control_resolution`` /
``no_resize_control`` size it otherwise.
"""

from trainer.families.spec import ControlSpec, FamilySpec, Variant

FLUX1 = FamilySpec(
    name="flux1", label="FLUX.1", folder="flux", denoiser="transformer", objective="flow",
    text_encoders=("clip_l", "t5xxl"), embedded="embedded:tiny-flux",
    pipelines=("FluxPipeline",), train_blocks=("all", "single", "double"),
    variants=(Variant("dev", "FLUX.1-dev, guidance-distilled", "flux1-dev", 512),
              Variant("schnell", "FLUX.1-schnell", "flux1-schnell", 256)),
    part_settings={"vae": "model.ae", "clip_l": "model.clip_l", "t5xxl": "model.t5xxl"},
    kohya_version="flux1", textual_inversion=False)
# BFL's preferred Kontext resolutions (flux/util.py; diffusers' PREFERRED_KONTEXT_RESOLUTIONS,
# ComfyUI's FluxKontextImageScale): (width, height), about 1024 x 1024 each
KONTEXT_SIZES = ((672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248),
                 (880, 1184), (944, 1104), (1024, 1024), (1104, 944), (1184, 880), (1248, 832),
                 (1328, 800), (1392, 752), (1456, 720), (1504, 688), (1568, 672))
KONTEXT_AREA = 1024 * 1024
FLUX1_KONTEXT = FamilySpec(
    name="flux1_kontext", label="FLUX.1 Kontext", folder="flux", denoiser="transformer",
    objective="flow", text_encoders=("clip_l", "t5xxl"), embedded="embedded:tiny-flux-kontext",
    pipelines=("FluxKontextPipeline",), train_blocks=("all", "single", "double"),
    variants=(Variant("dev", "FLUX.1 Kontext [dev]", "flux1-dev", 512),),
    part_settings={"vae": "model.ae", "clip_l": "model.clip_l", "t5xxl": "model.t5xxl"},
    kohya_version="flux1", textual_inversion=False,
    controls=ControlSpec(max=1, required=0, area=KONTEXT_AREA, multiple=16,
                         sizes=KONTEXT_SIZES))
SPECS = (FLUX1, FLUX1_KONTEXT)
KONTEXT = FLUX1_KONTEXT.name
