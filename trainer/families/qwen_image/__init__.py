"""Qwen-Image (and 2512, the same architecture): Alibaba Qwen's 20B MMDiT transformer with the
Qwen2.5-VL-7B text encoder, its own 16-channel Wan-style VAE (5-D latents, per-channel mean and
std), flow matching with the shift by image size of its scheduler. The edit variants (Edit, 2509,
2511: trainer/families/qwen_image/edit.py) train on image pairs: one control image (Edit), up to
three (2509, 2511), in the text encoder's prompt and beside the target's tokens; by default each
control takes its target's bucket, as musubi-tuner trains it. A diffusers folder names its
variant (its pipeline), a 2511 single file too (ComfyUI's ``__index_timestep_zero__``); an Edit or
2509 single file has Qwen-Image's keys, so ``model.model_version = "qwen_image_edit"`` /
``"qwen_image_edit_2509"`` says which (musubi-tuner's ``--model_version edit`` / ``edit-2509``)."""

from trainer.families.spec import ControlSpec, FamilySpec, Variant

QWEN_IMAGE = FamilySpec(
    name="qwen_image", label="Qwen-Image", folder="qwen_image", denoiser="transformer",
    objective="flow", text_encoders=("qwen25_7b",), embedded="embedded:tiny-qwen-image",
    pipelines=("QwenImagePipeline", "QwenImageEditPipeline", "QwenImageEditPlusPipeline"),
    more_twins=("embedded:tiny-qwen-image-edit",),
    # the text length of a step: Qwen2.5-VL's tokens, at most the pipeline's 512 (the slot
    # named for T5's length, which the advisor reads)
    variants=(Variant("base", "Qwen-Image", "qwen-image", 512),
              Variant("edit", "Qwen-Image-Edit", "qwen-image", 512, "qwen_image_edit"),
              Variant("edit-2509", "Qwen-Image-Edit-2509", "qwen-image", 512,
                      "qwen_image_edit_2509"),
              Variant("edit-2511", "Qwen-Image-Edit-2511", "qwen-image", 512,
                      "qwen_image_edit_2511")),
    # each variant's count is checked when it loads (edit.py: Edit 1, 2509 / 2511 up to 3)
    controls=ControlSpec(max=3, text=True),
    part_settings={"vae": "model.vae", "qwen25_7b": "model.text_encoder"},
    kohya_version="qwen_image", textual_inversion=False, continues_lora=True)
SPECS = (QWEN_IMAGE,)
