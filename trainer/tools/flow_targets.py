"""The layers of a loaded FLUX.1 / SD 3.5 model under the names their LoRA files give them.

The model is diffusers' (``FluxTransformer2DModel`` / ``SD3Transformer2DModel`` and the text
encoders); the files name it as :mod:`trainer.families.flux.lora` and
:mod:`trainer.families.sd3.lora` write and as the ecosystem writes:

- FLUX.1: sd-scripts' kohya names on Black Forest Labs' layout (``lora_unet_double_blocks_0_
  img_attn_qkv``), where a fused layer is several diffusers layers in row order (the target's
  ``pieces``); the embedders of sd-scripts' ``in_dims`` too. CLIP-L ``lora_te1_`` and T5
  ``lora_te3_`` (T5 is the pipeline's ``text_encoder_2``).
- SD 3.5: the ``transformer.*`` form (read as ``lora_transformer_<diffusers path>``), CLIP-L
  ``text_encoder.`` / ``lora_te1_``, CLIP-G ``text_encoder_2.`` / ``lora_te2_``, T5
  ``lora_te3_``; and sd-scripts' own SD3 names (``lora_unet_joint_blocks_0_x_block_attn_qkv``),
  fused like FLUX.1's, with the last block's pre-only context modulation's halves swapped
  (diffusers stores it as (scale, shift), Stability as (shift, scale)).
- Either family: diffusers' own LoRA form of the transformer (``transformer.<path>``).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.families.flux.lora import flux_part_modules
from trainer.export.names import kohya_module_name, unwrap
from trainer.families.sd3.lora import SD3_PARTS, sd3_target_modules
from trainer.tools.targets import Target, encoder_targets, model_targets, table_of

FLOW_FAMILIES = ("flux1", "sd3")
TRANSFORMER = "transformer"
LAYERS = (torch.nn.Linear, torch.nn.Conv2d)


def _as_is(path: str) -> str:
    return path


def transformer_layers(transformer: torch.nn.Module) -> list[tuple[Target, list[str]]]:
    """Every layer of the transformer under its diffusers path (``lora_transformer_...``)."""
    return [(Target(kohya_module_name("lora_transformer", path), path, TRANSFORMER, module), [])
            for path, module in unwrap(transformer).named_modules()
            if isinstance(module, LAYERS)]


def _group(transformer: torch.nn.Module, name: str, paths: tuple[str, ...],
           swap: bool = False) -> Target:
    root = unwrap(transformer)
    layers = tuple(root.get_submodule(p) for p in paths)
    return Target(name, paths[0], TRANSFORMER, layers[0], layers if len(layers) > 1 else (),
                  swap)


def flux_transformer_targets(transformer: torch.nn.Module, in_dims: bool = True
                             ) -> list[Target]:
    """The BFL-named targets of sd-scripts' FLUX.1 LoRA (``in_dims``: with the embedders)."""
    return [_group(transformer, kohya_module_name("lora_unet", bfl), paths)
            for bfl, paths in flux_part_modules(transformer, in_dims=in_dims).items()]


def sd3_kohya_targets(transformer: torch.nn.Module) -> list[Target]:
    """sd-scripts' SD3 names over diffusers' layers (fused qkv; swapped last modulation)."""
    root = unwrap(transformer)
    existing = {n for n, _ in root.named_modules()}
    layers = root.config.num_layers
    out = []
    for n in range(layers):
        for part, modules in SD3_PARTS.items():
            paths = tuple(f"transformer_blocks.{n}.{m}" for m in modules)
            if not all(p in existing for p in paths):
                continue
            swap = part == "context_block_adaLN_modulation_1" and n == layers - 1
            out.append(_group(transformer, f"lora_unet_joint_blocks_{n}_{part}", paths, swap))
    return out


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """CLIP-L (``lora_te1_``, also ``lora_te_``: the ``text_encoder.`` peft form), SD 3.5's
    CLIP-G (``lora_te2_``) and T5 (``lora_te3_``)."""
    found = encoder_targets(model.text_encoder, "lora_te1", "te1", aliases=["lora_te"])
    if model.version == "flux1":
        return found + encoder_targets(model.text_encoder_2, "lora_te3", "te3", rename=_as_is)
    found += encoder_targets(model.text_encoder_2, "lora_te2", "te2")
    if getattr(model, "text_encoder_3", None) is not None:
        found += encoder_targets(model.text_encoder_3, "lora_te3", "te3", rename=_as_is)
    return found


def flow_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """Every name a FLUX.1 / SD 3.5 LoRA file may give a layer of ``model``."""
    transformer = model.denoiser
    found = transformer_layers(transformer)
    if model.version == "flux1":
        found += [(t, []) for t in flux_transformer_targets(transformer)]
    else:
        found += [(t, []) for t in sd3_kohya_targets(transformer)]
    return found + text_targets(model)


def family_name_table(model: Any) -> dict[str, Target]:
    """Every name a LoRA file may give a layer of ``model``, of any family -> that layer."""
    if model.version in FLOW_FAMILIES:
        return table_of(flow_targets(model))
    return table_of(model_targets(model))


def lora_targets(model: Any) -> list[Target]:
    """The layers that the family's LoRA trains, named as its files name them: FLUX.1's BFL
    kohya names (double and single blocks) and CLIP-L / T5; SD 3.5's joint blocks' layers
    (``lora_transformer_<path>``: their ``transformer.*`` keys) and CLIP-L / CLIP-G; see
    :mod:`trainer.families.flux.lora` and :mod:`trainer.families.sd3.lora`."""
    from trainer.methods.lora import T5_TARGETS, TEXT_ENCODER_TARGETS
    from trainer.tools.targets import matches

    transformer = model.unet
    if model.version == "flux1":
        out = flux_transformer_targets(transformer, in_dims=False)
    else:
        chosen = set(sd3_target_modules(transformer))
        out = [t for t, _ in transformer_layers(transformer) if t.path in chosen]
    for target, _ in text_targets(model):
        if target.part == "te3":
            if model.version == "flux1" and matches(target.path, T5_TARGETS):
                out.append(target)  # SD 3.5 files hold no T5 (trainer/families/sd3/lora.py)
        elif matches(target.path, TEXT_ENCODER_TARGETS):
            out.append(target)
    return out
