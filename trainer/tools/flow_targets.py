"""The layers of a loaded FLUX.1 / SD 3.5 model under the names their LoRA files give them.

The model is diffusers' (``FluxTransformer2DModel`` / ``SD3Transformer2DModel`` and the text
encoders); the files name it as :mod:`trainer.families.flux.lora` and
:mod:`trainer.families.sd3.lora` write and as the ecosystem writes, each family's names in its
folder's ``targets`` role (:mod:`trainer.families.flux.targets`,
:mod:`trainer.families.sd3.targets`):

- FLUX.1: sd-scripts' kohya names on Black Forest Labs' layout (``lora_unet_double_blocks_0_
  img_attn_qkv``), where a fused layer is several diffusers layers in row order (the target's
  ``pieces``); the embedders of sd-scripts' ``in_dims`` too. CLIP-L ``lora_te1_`` and T5
  ``lora_te3_`` (T5 is the pipeline's ``text_encoder_2``).
- SD 3.5: the ``transformer.*`` form (read as ``lora_transformer_<diffusers path>``), CLIP-L
  ``text_encoder.`` / ``lora_te1_``, CLIP-G ``text_encoder_2.`` / ``lora_te2_``, T5
  ``lora_te3_``; and sd-scripts' own SD3 names (``lora_unet_joint_blocks_0_x_block_attn_qkv``),
  fused like FLUX.1's, with the last block's pre-only context modulation's halves swapped
  (diffusers stores it as (scale, shift), Stability as (shift, scale)).
- Either family: diffusers' own LoRA form of the transformer (``transformer.<path>``), and a
  LyCORIS file's ``lycoris_<path>``.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any, Optional

import torch

from trainer.export.flow_lycoris import diffusers_lycoris_name
from trainer.export.names import kohya_module_name, unwrap
from trainer.families import is_flow, role
from trainer.tools.targets import Target, model_targets, table_of

TRANSFORMER = "transformer"
LAYERS = (torch.nn.Linear, torch.nn.Conv2d)


def transformer_layers(transformer: torch.nn.Module) -> list[tuple[Target, list[str]]]:
    """Every layer of the transformer under its diffusers path (``lora_transformer_...``; also
    ``lycoris_...``, the LyCORIS files' name: trainer/export/flow_lycoris.py)."""
    return [(Target(kohya_module_name("lora_transformer", path), path, TRANSFORMER, module),
             [diffusers_lycoris_name(path)])
            for path, module in unwrap(transformer).named_modules()
            if isinstance(module, LAYERS)]


def group(transformer: torch.nn.Module, name: str, paths: tuple[str, ...],
          swap: bool = False) -> Target:
    """The target ``name`` over the diffusers layers ``paths`` (fused in row order)."""
    root = unwrap(transformer)
    layers = tuple(root.get_submodule(p) for p in paths)
    return Target(name, paths[0], TRANSFORMER, layers[0], layers if len(layers) > 1 else (),
                  swap)


def family_targets(model: Any) -> ModuleType:
    """The family's ``targets`` role (trainer/families/<folder>/targets.py): its files' names."""
    return role(model.version, "targets")


def text_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """CLIP-L (``lora_te1_``, also ``lora_te_``: the ``text_encoder.`` peft form), SD 3.5's
    CLIP-G (``lora_te2_``) and T5 (``lora_te3_``)."""
    return family_targets(model).text_targets(model)


def flow_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """Every name a FLUX.1 / SD 3.5 LoRA file may give a layer of ``model``."""
    transformer = model.denoiser
    found = transformer_layers(transformer)
    found += [(t, []) for t in family_targets(model).kohya_targets(transformer)]
    return found + text_targets(model)


def family_name_table(model: Any) -> dict[str, Target]:
    """Every name a LoRA file may give a layer of ``model``, of any family -> that layer."""
    if is_flow(model.version):
        return table_of(flow_targets(model))
    return table_of(model_targets(model))


def lora_targets(model: Any) -> list[Target]:
    """The layers that the family's LoRA trains, named as its files name them: FLUX.1's BFL
    kohya names (double and single blocks) and CLIP-L / T5; SD 3.5's joint blocks' layers
    (``lora_transformer_<path>``: their ``transformer.*`` keys) and CLIP-L / CLIP-G; see
    :mod:`trainer.families.flux.lora` and :mod:`trainer.families.sd3.lora`."""
    from trainer.methods.lora import T5_TARGETS, TEXT_ENCODER_TARGETS
    from trainer.tools.targets import matches

    targets = family_targets(model)
    out = targets.trained_targets(model.denoiser)
    for target, _ in text_targets(model):
        if target.part == "te3":
            if targets.TRAINS_T5 and matches(target.path, T5_TARGETS):
                out.append(target)  # SD 3.5 files hold no T5 (trainer/families/sd3/lora.py)
        elif matches(target.path, TEXT_ENCODER_TARGETS):
            out.append(target)
    return out


# a Black Forest Labs block layer -> the ratio of its shape [out, in] that its MLP sets: (ratio,
# its value with a plain MLP of 4 x the width (FLUX.1, Chroma), with a gated one of 3 x (FLUX.2))
MLP_SHAPES = {"img_mlp_0": (lambda o, i: o / i, 4, 6), "txt_mlp_0": (lambda o, i: o / i, 4, 6),
              "img_mlp_2": (lambda o, i: i / o, 4, 3), "txt_mlp_2": (lambda o, i: i / o, 4, 3),
              "linear1": (lambda o, i: o / i, 7, 9), "linear2": (lambda o, i: i / o, 5, 4)}
BFL_LAYER = re.compile(r"^lora_unet_(double|single)_blocks_\d+_(.+)$")


def bfl_gated_mlp(modules: dict[str, Any]) -> Optional[bool]:
    """Whether a file's BFL block layers (``lora_unet_double_blocks_0_img_mlp_0``...) have
    FLUX.2's gated MLP (True) or the plain one of FLUX.1 and Chroma (False), by the shapes of
    their LoRA; None when no such layer tells."""
    for name, module in modules.items():
        match = BFL_LAYER.match(name)
        shape = MLP_SHAPES.get(match.group(2)) if match else None
        t = module.tensors
        if shape is None or "lora_down.weight" not in t or "lora_up.weight" not in t:
            continue
        ratio = shape[0](t["lora_up.weight"].shape[0], t["lora_down.weight"].shape[1])
        if abs(ratio - shape[2]) < 1e-6:
            return True
        if abs(ratio - shape[1]) < 1e-6:
            return False
    return None


def bfl_modulated(modules: dict[str, Any]) -> bool:
    """Whether a file's BFL blocks hold modulation layers (``img_mod_lin``, ``modulation_lin``:
    FLUX.1's, which sd-scripts' and this studio's FLUX.1 LoRA train; Chroma's and FLUX.2's
    blocks have none)."""
    parts = [m.group(2) for n in modules if (m := BFL_LAYER.match(n))]
    return any(p.endswith("_mod_lin") or p == "modulation_lin" for p in parts)
