"""sd-scripts' LoRA network options on peft's LoRA: block-wise ranks (as ``rank_pattern`` /
``alpha_pattern`` on the modules' full paths, so every module keeps peft's layer and the file
keeps kohya's names, with a rank per module) and the optimizer's parameter groups for
block-wise learning rates and LoRA+.

LoRA+ (Hayou, Ghosh, Yu 2024, "LoRA+: Efficient Low Rank Adaptation of Large Models"): the B
matrices (peft's ``lora_B``, kohya's ``lora_up``) learn at ``ratio`` times the rate of the A
matrices; sd-scripts' ``prepare_optimizer_params`` puts them in a group of their own, per text
encoder and per UNet block. The blocks and their weights are :mod:`trainer.config.lora_blocks`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Optional

import torch

from trainer.config import TrainConfig
from trainer.config.lora_blocks import block_index, block_lr_weights, block_ranks
from trainer.export.names import kohya_module_name, unwrap
from trainer.families import FAMILIES


def _has_unet(family: Optional[str]) -> bool:
    """Whether ``family`` denoises with a UNet (whose blocks the block-wise options name)."""
    return family in FAMILIES and FAMILIES[family].denoiser == "unet"


def kohya_unet_namer(unet: torch.nn.Module, family: str) -> Callable[[str], str]:
    """diffusers module path -> kohya name (``lora_unet_...``; SDXL on the SGM layout)."""
    from trainer.export.metadata import lora_naming

    rename = lora_naming(family).unet_rename(unet) or (lambda p: p)
    return lambda path: kohya_module_name("lora_unet", rename(path))


def _targets(unet: torch.nn.Module, suffixes: list[str]) -> list[tuple[str, Any]]:
    out = []
    for path, module in unwrap(unet).named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and any(
                path == s or path.endswith("." + s) for s in suffixes):
            out.append((path, module))
    return out


def block_lora_config(cfg: TrainConfig, unet: torch.nn.Module, family: str,
                      targets: list[str], conv_targets: list[str]) -> Optional[Any]:
    """The UNet's LoraConfig with a rank and alpha per module from its block (sd-scripts: linear
    and 1x1 convolutions take block_dims, 3x3 ones conv_block_dims); None without block
    settings. Modules of rank 0 get no LoRA. ``targets`` / ``conv_targets``: the module
    names (suffixes) of plain LoRA and of LoCon."""
    from peft import LoraConfig

    net = cfg.network
    ranks = block_ranks(net, family) if _has_unet(family) else None
    if ranks is None:
        return None
    suffixes = targets + (conv_targets if ranks["conv_dims"] else [])
    namer = kohya_unet_namer(unet, family)
    rank_pattern, alpha_pattern, paths = {}, {}, []
    for path, module in _targets(unet, suffixes):
        idx = block_index(namer(path), family)
        conv3 = isinstance(module, torch.nn.Conv2d) and module.kernel_size != (1, 1)
        dims, alphas = (ranks["conv_dims"], ranks["conv_alphas"]) if conv3 else (
            ranks["dims"], ranks["alphas"])
        if idx < 0 or dims is None or dims[idx] == 0:
            continue
        key = re.escape(path)
        rank_pattern[key], alpha_pattern[key] = dims[idx], float(alphas[idx])
        paths.append(path)
    if not rank_pattern:
        raise ValueError("network.block_dims / lr weights leave no UNet block with a LoRA: "
                         "every block's rank or weight is 0")
    return LoraConfig(r=net.network_dim, lora_alpha=net.network_alpha,
                      lora_dropout=net.network_dropout or 0.0, init_lora_weights="gaussian",
                      target_modules=paths,
                      rank_pattern=rank_pattern, alpha_pattern=alpha_pattern)


def _loraplus_ratio(cfg: TrainConfig, unet: bool) -> Optional[float]:
    net = cfg.network
    own = net.loraplus_unet_lr_ratio if unet else net.loraplus_text_encoder_lr_ratio
    return own or net.loraplus_lr_ratio


def network_groups(cfg: TrainConfig, name: str, module: torch.nn.Module, lr: float,
                   family: Optional[str] = None) -> list[dict[str, Any]]:
    """The parameter groups of one adapted model (``name``: unet, text_encoder, ...): one, or
    one per UNet block with its lr weight (SD families with block lr weights), each split in
    A and B (``<name> plus`` at lr x the LoRA+ ratio) when LoRA+ is on."""
    unet = name == "unet"
    ratio = _loraplus_ratio(cfg, unet)
    weights = block_lr_weights(cfg.network, family) if unet and _has_unet(family) else None
    namer = kohya_unet_namer(module, family) if weights is not None else None
    buckets: dict[tuple[int, bool], list[torch.nn.Parameter]] = {}
    for path, param in unwrap(module).named_parameters():
        if "lora_" not in path:
            continue
        block = -1
        if namer is not None:
            block = block_index(namer(path.split(".lora_")[0]), family)
        plus = ratio is not None and ".lora_B." in f".{path}."
        buckets.setdefault((block, plus), []).append(param)
    groups = []
    for (block, plus), params in sorted(buckets.items()):
        rate = lr * (weights[block] if weights is not None and block >= 0 else 1.0)
        rate = rate * ratio if plus else rate
        label = name + (f"_block{block}" if weights is not None else "") + (" plus" if plus
                                                                             else "")
        groups.append({"params": params, "lr": rate, "name": label})
    return groups
