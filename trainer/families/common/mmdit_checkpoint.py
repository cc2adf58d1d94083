"""FLUX.1 and SD 3.x as single files in their original layouts (Black Forest Labs', Stability's).

diffusers reads these layouts (``convert_flux_transformer_checkpoint_to_diffusers``,
``convert_sd3_transformer_checkpoint_to_diffusers`` in ``loaders/single_file_utils.py``, 0.42.1);
this module writes them, from the model's own modules, and the tests hold it to diffusers'
reader (``from_single_file`` of what is written gives the same outputs). The names follow the
table in ``docs/flow_families_plan.md``:

- FLUX.1: diffusers' split attention projections are fused back: ``to_q/to_k/to_v`` ->
  ``img_attn.qkv``, ``add_{q,k,v}_proj`` -> ``txt_attn.qkv``, and in the single blocks
  ``to_q/to_k/to_v`` + ``proj_mlp`` -> ``linear1`` (rows in that order); the QK norms' weights
  are ``.scale``; ``norm_out.linear`` -> ``final_layer.adaLN_modulation.1`` with its two halves
  swapped (diffusers' AdaLayerNormContinuous is (scale, shift), the original (shift, scale)).
- SD 3.x: ``transformer_blocks.N`` -> ``joint_blocks.N.{x_block,context_block}`` with fused
  ``attn.qkv`` (and ``x_block.attn2.qkv`` for 3.5 medium's dual-attention blocks), QK norms as
  ``ln_q``/``ln_k``, and the halves swapped in ``final_layer.adaLN_modulation.1`` and in the last
  block's pre-only ``context_block.adaLN_modulation.1``.

The shipped forms: FLUX.1 as BFL ships it, the transformer alone with bare keys
(``flux1-dev.safetensors``; the VAE, CLIP-L and T5 are separate files, written here with
:func:`vae_tensors`, :func:`clip_tensors`, :func:`t5_tensors`); asked for more parts, the
all-in-one form ComfyUI reads (``model.diffusion_model.``, ``vae.``, ``text_encoders.*``).
SD 3.x as Stability ships ``sd3.5_large.safetensors``: transformer + VAE
(``first_stage_model.``), optionally the text encoders under ``text_encoders.*``. SD 3's CLIP-L
has no projection in the original (diffusers' reader sets an identity), so none is written.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import torch

from trainer.export.metadata import SPEC_VERSION
from trainer.export.names import text_encoder_module_path, unwrap
from trainer.families.sd import checkpoint
from trainer.system.safe_write import save_safetensors_atomic

DIT = "model.diffusion_model."
TEXT = {"clip_l": "text_encoders.clip_l.transformer.",
        "clip_g": "text_encoders.clip_g.transformer.",
        "t5xxl": "text_encoders.t5xxl.transformer."}
COMPONENT = {"flux": {"vae": "vae", "clip_l": "text_encoder", "t5xxl": "text_encoder_2"},
             "sd3": {"vae": "vae", "clip_l": "text_encoder", "clip_g": "text_encoder_2",
                     "t5xxl": "text_encoder_3"}}
ARCHITECTURE = {"flux1-dev": "flux-1-dev", "flux1-schnell": "flux-1-schnell",
                "sd35-large": "stable-diffusion-3.5-large",
                "sd35-medium": "stable-diffusion-3.5-medium",
                "sd3-medium": "stable-diffusion-3-medium"}
IMPLEMENTATION = {"flux": "https://github.com/black-forest-labs/flux",
                  "sd3": "https://github.com/Stability-AI/generative-models"}
FLUX_FIXED = (("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
              ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
              ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
              ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
              ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
              ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
              ("context_embedder", "txt_in"), ("x_embedder", "img_in"),
              ("proj_out", "final_layer.linear"))
FLUX_DOUBLE = (("norm1.linear", "img_mod.lin"), ("norm1_context.linear", "txt_mod.lin"),
               ("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"),
               ("ff.net.0.proj", "img_mlp.0"), ("ff.net.2", "img_mlp.2"),
               ("ff_context.net.0.proj", "txt_mlp.0"), ("ff_context.net.2", "txt_mlp.2"))
FLUX_DOUBLE_NORMS = (("attn.norm_q", "img_attn.norm.query_norm"),
                     ("attn.norm_k", "img_attn.norm.key_norm"),
                     ("attn.norm_added_q", "txt_attn.norm.query_norm"),
                     ("attn.norm_added_k", "txt_attn.norm.key_norm"))
SD3_FIXED = (("pos_embed.proj", "x_embedder.proj"),
             ("time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0"),
             ("time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2"),
             ("time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0"),
             ("time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2"),
             ("context_embedder", "context_embedder"), ("proj_out", "final_layer.linear"))
SD3_BLOCK = (("attn.to_out.0", "x_block.attn.proj"),
             ("attn.to_add_out", "context_block.attn.proj"),
             ("attn2.to_out.0", "x_block.attn2.proj"),
             ("norm1.linear", "x_block.adaLN_modulation.1"),
             ("ff.net.0.proj", "x_block.mlp.fc1"), ("ff.net.2", "x_block.mlp.fc2"),
             ("ff_context.net.0.proj", "context_block.mlp.fc1"),
             ("ff_context.net.2", "context_block.mlp.fc2"),
             ("attn.norm_q", "x_block.attn.ln_q"), ("attn.norm_k", "x_block.attn.ln_k"),
             ("attn.norm_added_q", "context_block.attn.ln_q"),
             ("attn.norm_added_k", "context_block.attn.ln_k"),
             ("attn2.norm_q", "x_block.attn2.ln_q"), ("attn2.norm_k", "x_block.attn2.ln_k"))
SD3_FUSED = ((("attn.to_q", "attn.to_k", "attn.to_v"), "x_block.attn.qkv"),
             (("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"), "context_block.attn.qkv"),
             (("attn2.to_q", "attn2.to_k", "attn2.to_v"), "x_block.attn2.qkv"))


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """(a, b) -> (b, a) along the rows: diffusers' (scale, shift) <-> the original's
    (shift, scale)."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def _move(sd: dict, out: dict, src: str, dst: str, suffix: str = "") -> None:
    """``src.weight``/``src.bias`` -> ``dst.weight``/``dst.bias`` (``suffix`` replaces
    ``weight`` for the QK norms' ``scale``)."""
    for kind in ("weight", "bias"):
        if f"{src}.{kind}" in sd:
            out[f"{dst}.{suffix or kind}"] = sd.pop(f"{src}.{kind}")


def _fuse(sd: dict, out: dict, sources: Iterable[str], dst: str) -> None:
    """Concatenate the rows of ``sources`` (weights and biases) into ``dst``."""
    sources = list(sources)
    for kind in ("weight", "bias"):
        parts = [sd.pop(f"{s}.{kind}") for s in sources if f"{s}.{kind}" in sd]
        if parts:
            if len(parts) != len(sources):
                raise ValueError(f"{dst}.{kind}: only {len(parts)} of {sources} are present")
            out[f"{dst}.{kind}"] = torch.cat(parts, dim=0)


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the weights (meta tensors stay: the tests map real-size layouts with them)."""
    return {k: v.detach() if v.is_meta else v.detach().to("cpu")
            for k, v in unwrap(module).state_dict().items()}


def _final_modulation(sd: dict, out: dict) -> None:
    for kind in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{kind}"] = swap_halves(
            sd.pop(f"norm_out.linear.{kind}"))


def _leftover(sd: Mapping[str, Any], layout: str) -> None:
    if sd:
        raise ValueError(f"weights with no place in {layout}: {sorted(sd)[:8]}")


def flux_tensors(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A diffusers FluxTransformer2DModel in BFL's layout (bare keys)."""
    sd, out = _weights(transformer), {}
    for src, dst in FLUX_FIXED:
        _move(sd, out, src, dst)
    _final_modulation(sd, out)
    config = unwrap(transformer).config
    for i in range(config.num_layers):
        src, dst = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for a, b in FLUX_DOUBLE:
            _move(sd, out, src + a, dst + b)
        for a, b in FLUX_DOUBLE_NORMS:
            _move(sd, out, src + a, dst + b, "scale")
        _fuse(sd, out, [src + f"attn.to_{p}" for p in "qkv"], dst + "img_attn.qkv")
        _fuse(sd, out, [src + f"attn.add_{p}_proj" for p in "qkv"], dst + "txt_attn.qkv")
    for i in range(config.num_single_layers):
        src, dst = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        _move(sd, out, src + "norm.linear", dst + "modulation.lin")
        _move(sd, out, src + "proj_out", dst + "linear2")
        _move(sd, out, src + "attn.norm_q", dst + "norm.query_norm", "scale")
        _move(sd, out, src + "attn.norm_k", dst + "norm.key_norm", "scale")
        _fuse(sd, out, [src + f"attn.to_{p}" for p in "qkv"] + [src + "proj_mlp"], dst + "linear1")
    _leftover(sd, "BFL's FLUX.1 layout")
    return out


def sd3_tensors(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A diffusers SD3Transformer2DModel in Stability's layout (without the prefix)."""
    sd, out = _weights(transformer), {"pos_embed": None}
    out["pos_embed"] = sd.pop("pos_embed.pos_embed")
    for src, dst in SD3_FIXED:
        _move(sd, out, src, dst)
    _final_modulation(sd, out)
    layers = unwrap(transformer).config.num_layers
    for i in range(layers):
        src, dst = f"transformer_blocks.{i}.", f"joint_blocks.{i}."
        for a, b in SD3_BLOCK:
            _move(sd, out, src + a, dst + b)
        for sources, target in SD3_FUSED:
            _fuse(sd, out, [src + s for s in sources], dst + target)
        for kind in ("weight", "bias"):  # the last block's context side is "pre-only"
            weight = sd.pop(f"{src}norm1_context.linear.{kind}")
            out[f"{dst}context_block.adaLN_modulation.1.{kind}"] = (
                swap_halves(weight) if i == layers - 1 else weight)
    _leftover(sd, "Stability's SD 3 layout")
    return out


def vae_tensors(vae: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The 16-channel VAE in the original (LDM) names under ``prefix`` (``""`` for BFL's
    ``ae.safetensors``, ``vae.`` for ComfyUI's FLUX.1, ``first_stage_model.`` for SD 3.x)."""
    tensors = checkpoint.vae_tensors(vae)
    return {prefix + k.removeprefix(checkpoint.VAE_PREFIX): v for k, v in tensors.items()}


def clip_tensors(text_encoder: torch.nn.Module, prefix: str = "", projection: bool = True
                 ) -> dict[str, torch.Tensor]:
    """A transformers CLIP text model under ``prefix`` + ``text_model.*`` (and
    ``text_projection.weight`` when it has one and ``projection``), no ``position_ids``."""
    out = {}
    for key, tensor in _weights(text_encoder).items():
        if key.endswith("position_ids"):
            continue
        if key.startswith("text_projection."):
            if projection:
                out[prefix + key] = tensor
            continue
        out[prefix + text_encoder_module_path(key)] = tensor
    return out


def t5_tensors(text_encoder: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """A transformers T5 encoder in its own names under ``prefix``; the token embedding once
    (``shared.weight``), as the released ``t5xxl_*.safetensors`` files hold it."""
    sd = _weights(text_encoder)
    embed = sd.pop("encoder.embed_tokens.weight", None)
    if embed is not None and "shared.weight" not in sd:
        sd["shared.weight"] = embed
    return {prefix + k: v for k, v in sd.items()}


def kind_of(family: str) -> str:
    if family not in ARCHITECTURE:
        raise ValueError(f"family {family!r}: expected one of {', '.join(ARCHITECTURE)}")
    return "flux" if family.startswith("flux") else "sd3"


def flow_state_dict(components: Mapping[str, Any], family: str,
                    parts: Optional[Iterable[str]] = None) -> dict[str, torch.Tensor]:
    """The tensors of ``parts`` (default: FLUX.1 the transformer, SD 3.x transformer + VAE) in
    the family's original layout; see the module's notes for the prefixes."""
    kind = kind_of(family)
    parts = list(parts or (("transformer",) if kind == "flux" else ("transformer", "vae")))
    unknown = [p for p in parts if p != "transformer" and p not in COMPONENT[kind]]
    if unknown or "transformer" not in parts:
        raise ValueError(f"parts {parts}: a {family} file holds the transformer and any of "
                         f"{sorted(COMPONENT[kind])}")
    bare = kind == "flux" and parts == ["transformer"]
    convert = flux_tensors if kind == "flux" else sd3_tensors
    out = {("" if bare else DIT) + k: v for k, v in convert(components["transformer"]).items()}
    for part in [p for p in parts if p != "transformer"]:
        module = components[COMPONENT[kind][part]]
        if part == "vae":
            out.update(vae_tensors(module, "vae." if kind == "flux" else checkpoint.VAE_PREFIX))
        elif part == "t5xxl":
            out.update(t5_tensors(module, TEXT[part]))
        else:
            out.update(clip_tensors(module, TEXT[part], projection=part == "clip_g"))
    return out


def flow_modelspec(family: str, title: str, resolution: int = 1024) -> dict[str, str]:
    """sai_model_spec keys of a base model, as sd-scripts' ``sai_model_spec.py`` writes them."""
    return {"modelspec.sai_model_spec": SPEC_VERSION,
            "modelspec.architecture": ARCHITECTURE[family],
            "modelspec.implementation": IMPLEMENTATION[kind_of(family)],
            "modelspec.title": title, "modelspec.resolution": f"{resolution}x{resolution}",
            "modelspec.date": datetime.datetime.now().replace(microsecond=0).isoformat()}


def save_flow_checkpoint(path: str | Path, components: Mapping[str, Any], family: str,
                         metadata: Optional[Mapping[str, str]] = None, *,
                         parts: Optional[Iterable[str]] = None,
                         dtype: Optional[torch.dtype] = torch.bfloat16) -> Path:
    """Write ``components`` (diffusers/transformers modules under FluxPipeline's /
    StableDiffusion3Pipeline's names) as one original-layout file, atomically, with
    ``modelspec.*`` metadata (``metadata`` adds to / overrides it). Floating tensors are cast
    to ``dtype`` (``None`` keeps the model's; ``torch.float8_e4m3fn`` writes an fp8 file)."""
    tensors = flow_state_dict(components, family, parts)
    for key, tensor in tensors.items():
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[key] = tensor.contiguous()
    meta = flow_modelspec(family, Path(path).stem)
    meta.update(metadata or {})
    return save_safetensors_atomic(path, tensors, meta)
