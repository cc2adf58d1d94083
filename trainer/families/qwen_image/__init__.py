"""Qwen-Image (and 2512, the same architecture): Alibaba Qwen's 20B MMDiT transformer with the
Qwen2.5-VL-7B text encoder, its own 16-channel Wan-style VAE (5-D latents, per-channel mean and
std), flow matching with the shift by image size of its scheduler. The edit variants (Edit,
2509, 2511) are detected and named; training them is refused for now."""

from trainer.families.spec import FamilySpec, Variant

QWEN_IMAGE = FamilySpec(
    name="qwen_image", label="Qwen-Image", folder="qwen_image", denoiser="transformer",
    objective="flow", text_encoders=("qwen25_7b",), embedded="embedded:tiny-qwen-image",
    pipelines=("QwenImagePipeline",),
    # the text length of a step: Qwen2.5-VL's tokens, at most the pipeline's 512 (the slot
    # named for T5's length, which the advisor reads)
    variants=(Variant("base", "Qwen-Image", "qwen-image", 512),),
    part_settings={"vae": "model.vae", "qwen25_7b": "model.text_encoder"},
    kohya_version="qwen_image", textual_inversion=False, continues_lora=True)
SPECS = (QWEN_IMAGE,)
