"""The names of Qwen-Image's single files, shared by the writer (:mod:`.checkpoint`) and the
reader (:mod:`.single_file`): ComfyUI's all-in-one prefixes, and the VAE's Wan 2.1 names
(``qwen_image_vae.safetensors``) from diffusers' ``AutoencoderKLQwenImage`` keys, the inverse of
diffusers' ``convert_wan_vae_to_diffusers`` (the tests hold the round trip to it)."""

from __future__ import annotations

import re

DIT = "model.diffusion_model."
VAE = "vae."
TEXT = "text_encoders.qwen25_7b.transformer."
_RESNET = ((".norm1.gamma", ".residual.0.gamma"), (".conv1.", ".residual.2."),
           (".norm2.gamma", ".residual.3.gamma"), (".conv2.", ".residual.6."),
           (".conv_shortcut.", ".shortcut."))
_FIXED = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}


def _resnet(rest: str) -> str:
    for ours, theirs in _RESNET:
        if rest.startswith(ours):
            return theirs + rest[len(ours):]
    return rest


def wan_vae_name(key: str, res_blocks: int = 2) -> str:
    """A diffusers ``AutoencoderKLQwenImage`` key -> its Wan 2.1 name."""
    for ours, theirs in _FIXED.items():
        if key.startswith(ours):
            return theirs + key[len(ours):]
    side, rest = key.split(".", 1)
    if m := re.match(r"mid_block\.resnets\.(\d)(\..*)$", rest):
        return f"{side}.middle.{2 * int(m.group(1))}{_resnet(m.group(2))}"
    if rest.startswith("mid_block.attentions.0."):
        return f"{side}.middle.1." + rest[len("mid_block.attentions.0."):]
    if rest.startswith("norm_out."):
        return f"{side}.head.0." + rest[len("norm_out."):]
    if rest.startswith("conv_out."):
        return f"{side}.head.2." + rest[len("conv_out."):]
    if rest.startswith("conv_in."):
        return f"{side}.conv1." + rest[len("conv_in."):]
    if m := re.match(r"down_blocks\.(\d+)(\..*)$", rest):
        return f"{side}.downsamples.{m.group(1)}{_resnet(m.group(2))}"
    stride = res_blocks + 2  # resnets, then the upsampler, per up block
    if m := re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)(\..*)$", rest):
        return f"{side}.upsamples.{stride * int(m.group(1)) + int(m.group(2))}" \
               f"{_resnet(m.group(3))}"
    if m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0(\..*)$", rest):
        return f"{side}.upsamples.{stride * int(m.group(1)) + stride - 1}{m.group(2)}"
    raise ValueError(f"VAE key {key!r} has no Wan 2.1 name")
