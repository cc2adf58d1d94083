"""A Stable Diffusion model as ONE single-file checkpoint in the original key layout.

AUTOMATIC1111, ComfyUI and diffusers' ``from_single_file`` read checkpoints in the layout of the
original code (CompVis latent diffusion for SD 1.x/2.x, Stability's generative-models for SDXL):

    model.diffusion_model.*                 the UNet (``input_blocks``, ``middle_block``, ...)
    first_stage_model.*                     the VAE (``encoder.down.N.block.M``, ``mid.attn_1``)
    cond_stage_model.transformer.*          SD 1.x: CLIP ViT-L (transformers' names)
    cond_stage_model.model.*                SD 2.x: OpenCLIP ViT-H (``transformer.resblocks``)
    conditioner.embedders.0.transformer.*   SDXL: CLIP ViT-L
    conditioner.embedders.1.model.*         SDXL: OpenCLIP ViT-bigG, with ``text_projection``

diffusers converts that layout into its own (``diffusers.loaders.single_file_utils``); this module
is the other direction, derived from each model's config, and the tests hold it to diffusers'
reader. The UNet's map follows its config: ``input_blocks.0`` is ``conv_in``; each down block
gives ``layers_per_block`` entries (resnet at ``.0``, attention at ``.1``) and then, except the
last, a downsampler entry (``.0.op``); each up block gives ``layers_per_block + 1`` entries, its
upsampler in the last one (at ``.1.conv``, or ``.2.conv`` after an attention). Attention
modules keep diffusers' names and shapes (``proj_in`` stays a 1x1 conv in SD 1.x, a linear in
SD 2.x/SDXL, as the original's ``use_linear_in_transformer`` has it).

Choices the readers forced:

- The VAE's mid-block attention is a 1x1 conv in the original: ``q``/``k``/``v``/``proj_out``
  weights are written as ``[C, C, 1, 1]`` (diffusers squeezes them back).
- No ``position_ids``: no reader needs the buffer (transformers made it non-persistent; A1111
  and ComfyUI load with ``strict=False`` and rebuild it).
- SD 2.x: OpenCLIP ViT-H has 24 blocks, but SD 2 conditions on the penultimate one, so diffusers
  stores 23 and its reader skips ``resblocks.23`` and ``text_projection``
  (``SD_2_TEXT_ENCODER_KEYS_TO_IGNORE``). A1111 and ComfyUI build the full 24-block model, so
  for a 23-block encoder this writes block 23 as an identity block (zero output projections:
  the residual stream passes unchanged, so even a reader that used the last block would get
  the penultimate one) and an identity ``text_projection``. Encoders of another depth (tiny
  test models) are written as they are.
- OpenCLIP's ``text_projection`` is applied as ``x @ P``: the transpose of the linear weight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.names import text_encoder_module_path, unwrap
from trainer.system.safe_write import save_safetensors_atomic

FAMILIES = ("sd1", "sd2", "sdxl")
UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
CLIP_PREFIXES = {"sd1": "cond_stage_model.transformer.",
                 "sdxl": "conditioner.embedders.0.transformer."}
OPEN_CLIP_PREFIXES = {"sd2": "cond_stage_model.model.", "sdxl": "conditioner.embedders.1.model."}
OPEN_CLIP_H_BLOCKS = 24  # SD 2's ViT-H text tower; diffusers keeps 23 of them

# Renames inside a module, as (diffusers start, original start) of the rest of the key.
Renames = tuple[tuple[str, str], ...]
KEEP: Renames = ()
UNET_RESNET: Renames = (("norm1.", "in_layers.0."), ("conv1.", "in_layers.2."),
                        ("time_emb_proj.", "emb_layers.1."), ("norm2.", "out_layers.0."),
                        ("conv2.", "out_layers.3."), ("conv_shortcut.", "skip_connection."))
VAE_RESNET: Renames = (("conv_shortcut.", "nin_shortcut."),)
VAE_ATTENTION: Renames = (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."),
                          ("to_v.", "v."), ("to_out.0.", "proj_out."))
PrefixMap = dict[str, tuple[str, Renames]]

UNET_FIXED: PrefixMap = {
    "time_embedding.linear_1.": ("time_embed.0.", KEEP),
    "time_embedding.linear_2.": ("time_embed.2.", KEEP),
    "add_embedding.linear_1.": ("label_emb.0.0.", KEEP),  # SDXL's size/crop conditioning
    "add_embedding.linear_2.": ("label_emb.0.2.", KEEP),
    "conv_in.": ("input_blocks.0.0.", KEEP),
    "conv_norm_out.": ("out.0.", KEEP),
    "conv_out.": ("out.2.", KEEP),
}
UNET_DOWN = {"CrossAttnDownBlock2D": True, "DownBlock2D": False}  # type -> has attention
UNET_UP = {"CrossAttnUpBlock2D": True, "UpBlock2D": False}


def _block_attention(types: Any, known: dict[str, bool], what: str) -> list[bool]:
    bad = [t for t in types if t not in known]
    if bad:
        raise ValueError(f"{what} {bad} have no place in the original SD layout "
                         f"(supported: {sorted(known)})")
    return [known[t] for t in types]


def unet_prefix_map(config: Any) -> PrefixMap:
    """diffusers module prefix -> (original prefix, renames inside), from a UNet's config."""
    down = _block_attention(config["down_block_types"], UNET_DOWN, "down blocks")
    up = _block_attention(config["up_block_types"], UNET_UP, "up blocks")
    layers = config["layers_per_block"]
    if not isinstance(layers, int):
        raise ValueError(f"layers_per_block {layers!r}: only one count for all blocks is "
                         f"supported")
    if config.get("mid_block_type", "UNetMidBlock2DCrossAttn") != "UNetMidBlock2DCrossAttn":
        raise ValueError(f"mid block {config['mid_block_type']!r} is not an SD mid block")
    out = dict(UNET_FIXED)
    entry = 1
    for b, attention in enumerate(down):
        for j in range(layers):
            out[f"down_blocks.{b}.resnets.{j}."] = (f"input_blocks.{entry}.0.", UNET_RESNET)
            if attention:
                out[f"down_blocks.{b}.attentions.{j}."] = (f"input_blocks.{entry}.1.", KEEP)
            entry += 1
        if b < len(down) - 1:
            out[f"down_blocks.{b}.downsamplers.0.conv."] = (f"input_blocks.{entry}.0.op.", KEEP)
            entry += 1
    out["mid_block.resnets.0."] = ("middle_block.0.", UNET_RESNET)
    out["mid_block.attentions.0."] = ("middle_block.1.", KEEP)
    out["mid_block.resnets.1."] = ("middle_block.2.", UNET_RESNET)
    entry = 0
    for b, attention in enumerate(up):
        for j in range(layers + 1):
            out[f"up_blocks.{b}.resnets.{j}."] = (f"output_blocks.{entry}.0.", UNET_RESNET)
            if attention:
                out[f"up_blocks.{b}.attentions.{j}."] = (f"output_blocks.{entry}.1.", KEEP)
            entry += 1
        if b < len(up) - 1:
            slot = 2 if attention else 1
            out[f"up_blocks.{b}.upsamplers.0.conv."] = (f"output_blocks.{entry - 1}.{slot}.conv.",
                                                       KEEP)
    return out


def vae_prefix_map(config: Any) -> PrefixMap:
    """diffusers module prefix -> (original prefix, renames inside), from a VAE's config.

    The original decoder numbers its up blocks from the lowest resolution's end: diffusers'
    ``up_blocks.0`` is ``up.{n-1}``.
    """
    n = len(config["down_block_types"])
    layers = config["layers_per_block"]
    out: PrefixMap = {"quant_conv.": ("quant_conv.", KEEP),
                      "post_quant_conv.": ("post_quant_conv.", KEEP)}
    for part in ("encoder", "decoder"):
        for same in ("conv_in.", "conv_out."):
            out[f"{part}.{same}"] = (f"{part}.{same}", KEEP)
        out[f"{part}.conv_norm_out."] = (f"{part}.norm_out.", KEEP)
        out[f"{part}.mid_block.resnets.0."] = (f"{part}.mid.block_1.", VAE_RESNET)
        out[f"{part}.mid_block.resnets.1."] = (f"{part}.mid.block_2.", VAE_RESNET)
        out[f"{part}.mid_block.attentions.0."] = (f"{part}.mid.attn_1.", VAE_ATTENTION)
    for i in range(n):
        for j in range(layers):
            out[f"encoder.down_blocks.{i}.resnets.{j}."] = (f"encoder.down.{i}.block.{j}.",
                                                           VAE_RESNET)
        out[f"encoder.down_blocks.{i}.downsamplers.0.conv."] = (f"encoder.down.{i}.downsample"
                                                               f".conv.", KEEP)
        k = n - 1 - i
        for j in range(layers + 1):
            out[f"decoder.up_blocks.{i}.resnets.{j}."] = (f"decoder.up.{k}.block.{j}.",
                                                         VAE_RESNET)
        out[f"decoder.up_blocks.{i}.upsamplers.0.conv."] = (f"decoder.up.{k}.upsample.conv.",
                                                           KEEP)
    return out


def _rename(key: str, prefixes: PrefixMap, what: str) -> str:
    """The original name of ``key``: its longest module prefix in ``prefixes``, renamed."""
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:n]) + "."
        if head in prefixes:
            new_head, renames = prefixes[head]
            rest = key[len(head):]
            for old, new in renames:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            return new_head + rest
    raise ValueError(f"{what} weight {key!r} has no place in the original SD layout")


def original_module_path(path: str, prefixes: PrefixMap) -> str:
    """The original name of a module (not a weight): ``down_blocks.1.resnets.0.conv1`` ->
    ``input_blocks.4.0.in_layers.2``."""
    return _rename(path + ".weight", prefixes, "module")[: -len(".weight")]


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu") for k, v in unwrap(module).state_dict().items()}


def unet_tensors(unet: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The UNet's weights under ``model.diffusion_model.``."""
    prefixes = unet_prefix_map(unwrap(unet).config)
    return {UNET_PREFIX + _rename(k, prefixes, "UNet"): v for k, v in _tensors(unet).items()}


def vae_tensors(vae: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The VAE's weights under ``first_stage_model.``; mid attention weights as 1x1 convs."""
    prefixes = vae_prefix_map(unwrap(vae).config)
    out = {}
    for key, tensor in _tensors(vae).items():
        new = _rename(key, prefixes, "VAE")
        if ".mid.attn_1." in new and new.endswith(".weight") and tensor.dim() == 2:
            tensor = tensor.reshape(*tensor.shape, 1, 1)
        out[VAE_PREFIX + new] = tensor
    return out


def clip_tensors(text_encoder: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """A transformers CLIP text model under ``prefix`` + ``text_model.*`` (both transformers 4
    and 5 module paths), without the ``position_ids`` buffer."""
    out = {}
    for key, tensor in _tensors(text_encoder).items():
        if key.endswith("position_ids"):
            continue
        if key.startswith("text_projection."):
            raise ValueError("a CLIP ViT-L text encoder in the original layout has no "
                             "text_projection; pass a CLIPTextModel")
        out[prefix + text_encoder_module_path(key)] = tensor
    return out


def _open_clip_block(sd: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """One transformers encoder layer as an OpenCLIP residual block (q, k, v concatenated)."""
    src, dst = f"encoder.layers.{i}.", f"transformer.resblocks.{i}."
    out = {}
    for kind in ("weight", "bias"):
        qkv = [sd.pop(f"{src}self_attn.{p}_proj.{kind}") for p in "qkv"]
        out[f"{dst}attn.in_proj_{kind}"] = torch.cat(qkv, dim=0)
        for old, new in (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"),
                         ("layer_norm2", "ln_2"), ("mlp.fc1", "mlp.c_fc"),
                         ("mlp.fc2", "mlp.c_proj")):
            out[f"{dst}{new}.{kind}"] = sd.pop(f"{src}{old}.{kind}")
    return out


def identity_block(i: int, width: int, mlp_width: int, dtype: torch.dtype
                   ) -> dict[str, torch.Tensor]:
    """An OpenCLIP residual block that returns its input: both output projections are zero."""
    dst = f"transformer.resblocks.{i}."
    zeros = {"attn.in_proj_weight": (3 * width, width), "attn.in_proj_bias": (3 * width,),
             "attn.out_proj.weight": (width, width), "attn.out_proj.bias": (width,),
             "ln_1.bias": (width,), "ln_2.bias": (width,),
             "mlp.c_fc.weight": (mlp_width, width), "mlp.c_fc.bias": (mlp_width,),
             "mlp.c_proj.weight": (width, mlp_width), "mlp.c_proj.bias": (width,)}
    out = {dst + k: torch.zeros(shape, dtype=dtype) for k, shape in zeros.items()}
    out[dst + "ln_1.weight"] = torch.ones(width, dtype=dtype)
    out[dst + "ln_2.weight"] = torch.ones(width, dtype=dtype)
    return out


def open_clip_tensors(text_encoder: torch.nn.Module, prefix: str, *, pad_sd2: bool = False
                      ) -> dict[str, torch.Tensor]:
    """A transformers CLIP text model in OpenCLIP's layout under ``prefix``.

    ``pad_sd2`` restores SD 2's 24th block and ``text_projection`` (identities) when diffusers'
    23-block encoder is given; see the module's notes.
    """
    config = unwrap(text_encoder).config
    sd = {k.removeprefix("text_model."): v for k, v in _tensors(text_encoder).items()
          if not k.endswith("position_ids")}
    out = {"token_embedding.weight": sd.pop("embeddings.token_embedding.weight"),
           "positional_embedding": sd.pop("embeddings.position_embedding.weight"),
           "ln_final.weight": sd.pop("final_layer_norm.weight"),
           "ln_final.bias": sd.pop("final_layer_norm.bias")}
    if "text_projection.weight" in sd:
        out["text_projection"] = sd.pop("text_projection.weight").T.contiguous()
    blocks = config.num_hidden_layers
    for i in range(blocks):
        out.update(_open_clip_block(sd, i))
    if sd:
        raise ValueError(f"text encoder weights with no place in OpenCLIP's layout: {sorted(sd)}")
    if pad_sd2 and blocks == OPEN_CLIP_H_BLOCKS - 1:
        dtype = out["ln_final.weight"].dtype
        out.update(identity_block(blocks, config.hidden_size, config.intermediate_size, dtype))
        out.setdefault("text_projection", torch.eye(config.hidden_size, dtype=dtype))
    return {prefix + k: v for k, v in out.items()}


def _check_family(family: str, text_encoder_2: Optional[torch.nn.Module]) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    if family == "sdxl" and text_encoder_2 is None:
        raise ValueError("family 'sdxl' needs text_encoder_2 (OpenCLIP bigG, "
                         "CLIPTextModelWithProjection)")
    if family != "sdxl" and text_encoder_2 is not None:
        raise ValueError(f"family {family!r} has one text encoder; text_encoder_2 is SDXL's")


def ldm_state_dict(unet: torch.nn.Module, vae: torch.nn.Module, text_encoder: torch.nn.Module,
                   *, text_encoder_2: Optional[torch.nn.Module] = None, family: str = "sd1"
                   ) -> dict[str, torch.Tensor]:
    """All weights under their original (LDM / SGM) names, as CPU tensors in the model's dtype.

    ``family`` is ``sd1``, ``sd2`` or ``sdxl`` (which needs ``text_encoder_2``).
    """
    _check_family(family, text_encoder_2)
    out = unet_tensors(unet)
    out.update(vae_tensors(vae))
    if family == "sd2":
        out.update(open_clip_tensors(text_encoder, OPEN_CLIP_PREFIXES["sd2"], pad_sd2=True))
    else:
        out.update(clip_tensors(text_encoder, CLIP_PREFIXES[family]))
    if family == "sdxl":
        if "text_projection.weight" not in unwrap(text_encoder_2).state_dict():
            raise ValueError("SDXL's text_encoder_2 needs its text_projection "
                             "(CLIPTextModelWithProjection)")
        out.update(open_clip_tensors(text_encoder_2, OPEN_CLIP_PREFIXES["sdxl"]))
    return out


def save_checkpoint(path: str | Path, unet: torch.nn.Module, vae: torch.nn.Module,
                    text_encoder: torch.nn.Module, *,
                    text_encoder_2: Optional[torch.nn.Module] = None, family: str = "sd1",
                    dtype: Optional[torch.dtype] = torch.float16,
                    metadata: Optional[dict[str, str]] = None) -> Path:
    """Write the model as one original-layout safetensors checkpoint, atomically.

    Floating tensors are cast to ``dtype`` (``None`` keeps the model's); the models are not
    touched. Returns ``path``.
    """
    tensors = ldm_state_dict(unet, vae, text_encoder, text_encoder_2=text_encoder_2,
                             family=family)
    for key, tensor in tensors.items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[key] = tensor.contiguous()
    return save_safetensors_atomic(path, tensors, metadata)
