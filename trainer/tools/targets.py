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
    part: str  # unet, te, te1 or te2
    module: torch.nn.Module


def _layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    for path, module in unwrap(model).named_modules():
        if isinstance(module, LAYERS):
            yield path, module


def _sgm_names(unet: torch.nn.Module) -> Optional[Callable[[str], str]]:
    """diffusers path -> SGM path for this UNet, or None when it has no SGM layout."""
    from trainer.export.checkpoint import original_module_path, unet_prefix_map

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
    sgm = _sgm_names(unet)
    out = []
    for path, module in _layers(unet):
        diffusers_name = kohya_module_name("lora_unet", path)
        sgm_name = kohya_module_name("lora_unet", sgm(path)) if sgm else diffusers_name
        name, alias = (sgm_name, diffusers_name) if version == "sdxl" else (diffusers_name,
                                                                            sgm_name)
        out.append((Target(name, path, "unet", module), [alias] if alias != name else []))
    return out


def encoder_targets(encoder: torch.nn.Module, prefix: str, part: str,
                    aliases: Iterable[str] = ()) -> list[tuple[Target, list[str]]]:
    out = []
    for path, module in _layers(encoder):
        full = text_encoder_module_path(path)
        name = kohya_module_name(prefix, full)
        out.append((Target(name, path, part, module),
                    [kohya_module_name(a, full) for a in aliases]))
    return out


def model_targets(model: Any) -> list[tuple[Target, list[str]]]:
    """Every layer of the model's UNet and text encoder(s), with its alias names."""
    found = unet_targets(model.unet, model.version)
    if getattr(model, "text_encoder_2", None) is not None:
        found += encoder_targets(model.text_encoder, "lora_te1", "te1")
        found += encoder_targets(model.text_encoder_2, "lora_te2", "te2")
    else:
        found += encoder_targets(model.text_encoder, "lora_te", "te", aliases=["lora_te1"])
    return found


def name_table(model: Any) -> dict[str, Target]:
    """Every name a LoRA file may give a layer of ``model`` -> that layer."""
    found = model_targets(model)
    table = {alias: target for target, aliases in found for alias in aliases}
    table.update((target.name, target) for target, _ in found)
    return table


def matches(path: str, suffixes: Iterable[str]) -> bool:
    """peft's rule for ``target_modules``: the path is a suffix or ends in ``.suffix``."""
    return any(path == s or path.endswith("." + s) for s in suffixes)
