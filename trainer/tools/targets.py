"""The modules of a loaded model under the kohya names that LoRA files give them.

Each Linear and Conv2d layer of the UNet and text encoder(s) gets the name this studio writes
(:mod:`trainer.export.lora`: diffusers' module paths for SD 1.x/2.x, the original SGM layout for
SDXL's UNet, ``text_model.`` paths for the text encoders) and, as aliases, the names other tools
write for it: SGM names for an SD 1.x/2.x UNet, diffusers' paths for SDXL's, and ``lora_te1_``
for an SD 1.x/2.x text encoder (diffusers' ``convert_state_dict_to_kohya`` writes that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch

from trainer.export.lora import kohya_module_name, text_encoder_module_path, unwrap

LAYERS = (torch.nn.Linear, torch.nn.Conv2d)


@dataclass(frozen=True)
class Target:
    name: str  # the kohya name this studio writes
    path: str  # the module's path in its model
    part: str  # unet, te, te1 or te2; transformer, te3 (T5) for FLUX.1 / SD 3.5
    module: torch.nn.Module
    # a layer that the original layout fuses and diffusers splits (FLUX.1's qkv / linear1,
    # SD3's qkv: trainer/tools/flow_targets.py): diffusers' layers, in the fused rows' order
    pieces: tuple[torch.nn.Module, ...] = ()
    swap: bool = False  # the original's rows are diffusers' with the two halves swapped

    @property
    def layers(self) -> tuple[torch.nn.Module, ...]:
        return self.pieces or (self.module,)

    def weight(self) -> torch.Tensor:
        """The layer's weight as the original layout has it (fused rows, halves swapped)."""
        if not self.pieces and not self.swap:
            return self.module.weight
        weight = torch.cat([layer.weight.detach() for layer in self.layers], dim=0)
        return swap_halves(weight) if self.swap else weight


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """(a, b) -> (b, a) along the rows: diffusers' (scale, shift) <-> the original's
    (shift, scale); its own inverse."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def _layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    for path, module in unwrap(model).named_modules():
        if isinstance(module, LAYERS):
            yield path, module


def _sgm_names(unet: torch.nn.Module) -> Optional[Callable[[str], str]]:
    """diffusers path -> SGM path for this UNet, or None when it has no SGM layout."""
    from trainer.families.sd.checkpoint import original_module_path, unet_prefix_map

    try:
        prefixes = unet_prefix_map(unwrap(unet).config)
    except (ValueError, KeyError, TypeError):
        return None

    def rename(path: str) -> str:
        try:
            return original_module_path(path, prefixes)
        except ValueError:
            return path
    return rename


def unet_targets(unet: torch.nn.Module, version: str) -> list[tuple[Target, list[str]]]:
    """(target, alias names) of every layer of the UNet."""
    from trainer.families import role

    sgm, primary = _sgm_names(unet), role(version, "targets").SGM_NAMES
    out = []
    for path, module in _layers(unet):
        diffusers_name = kohya_module_name("lora_unet", path)
        sgm_name = kohya_module_name("lora_unet", sgm(path)) if sgm else diffusers_name
        name, alias = (sgm_name, diffusers_name) if primary else (diffusers_name, sgm_name)
        out.append((Target(name, path, "unet", module), [alias] if alias != name else []))
    return out


def encoder_targets(encoder: torch.nn.Module, prefix: str, part: str,
                    aliases: Iterable[str] = (),
                    rename: Callable[[str], str] = text_encoder_module_path
                    ) -> list[tuple[Target, list[str]]]:
    """Every layer of a text encoder; ``rename``: the path as the files name it (CLIP's under
    ``text_model.``, T5's as it is)."""
    out = []
    for path, module in _layers(encoder):
        full = rename(path)
        name = kohya_module_name(prefix, full)
        out.append((Target(name, path, part, module),
                    [kohya_module_name(a, full) for a in aliases]))
    return out


def model_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """Every layer of the model's UNet and text encoder(s), with its alias names (FLUX.1 /
    SD 3.5: :func:`trainer.tools.flow_targets.flow_targets`)."""
    found = unet_targets(model.denoiser, model.version)
    if getattr(model, "text_encoder_2", None) is not None:
        found += encoder_targets(model.text_encoder, "lora_te1", "te1")
        found += encoder_targets(model.text_encoder_2, "lora_te2", "te2")
    else:
        found += encoder_targets(model.text_encoder, "lora_te", "te", aliases=["lora_te1"])
    return found


def name_table(model: Any) -> dict[str, Target]:
    """Every name a LoRA file may give a layer of ``model`` -> that layer."""
    return table_of(model_targets(model))


def table_of(found: list[tuple[Target, list[str]]]) -> dict[str, Target]:
    """name -> layer of (target, aliases) pairs; a target's own name wins over an alias."""
    table = {alias: target for target, aliases in found for alias in aliases}
    table.update((target.name, target) for target, _ in found)
    return table


def matches(path: str, suffixes: Iterable[str]) -> bool:
    """peft's rule for ``target_modules``: the path is a suffix or ends in ``.suffix``."""
    return any(path == s or path.endswith("." + s) for s in suffixes)
