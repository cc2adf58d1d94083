"""``optimizer.block_lr``: sd-scripts' per-block learning rates of SDXL DreamBooth / fine-tuning
(``sdxl_train.py --block_lr``, 23 values).

sd-scripts trains its own copy of the original SGM UNet and puts each parameter in a block by
its name there (``get_block_params_to_optimize``): 0 ``time_embed.`` / ``label_emb.``;
``input_blocks.N`` is 1 + N (1-9); ``middle_block.N`` 10 + N (10-12); ``output_blocks.N``
13 + N (13-21); 22 ``out.``. A diffusers UNet's parameters get their original names from the
map the single-file writer uses (trainer/families/sd/checkpoint.py), and then the same rule, written
out here as sd-scripts writes it. Each block with a rate is one optimizer group at that rate;
sd-scripts leaves a block at 0 out of the optimizer, and here its weights are frozen too, so
they get no gradient at all.
"""

from __future__ import annotations

from typing import Any

import torch

BLOCKS = 23


def sgm_block(name: str) -> int:
    """sdxl_train.get_block_params_to_optimize: the block of a parameter of the SGM UNet."""
    if name.startswith("time_embed.") or name.startswith("label_emb."):
        return 0
    if name.startswith("input_blocks."):
        return 1 + int(name.split(".")[1])
    if name.startswith("middle_block."):
        return 10 + int(name.split(".")[1])
    if name.startswith("output_blocks."):
        return 13 + int(name.split(".")[1])
    if name.startswith("out."):
        return 22
    raise ValueError(f"unexpected parameter name: {name}")


def unet_blocks(unet: torch.nn.Module) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """The diffusers UNet's (name, parameter) pairs in each of sd-scripts' 23 blocks."""
    from trainer.export.names import unwrap
    from trainer.families.sd.checkpoint import original_module_path, unet_prefix_map

    inner = unwrap(unet)
    prefixes = unet_prefix_map(inner.config)
    blocks: list[list[tuple[str, torch.nn.Parameter]]] = [[] for _ in range(BLOCKS)]
    for name, param in inner.named_parameters():
        module, _, leaf = name.rpartition(".")
        original = f"{original_module_path(module, prefixes)}.{leaf}"
        index = sgm_block(original)
        if index >= BLOCKS:
            raise ValueError(f"optimizer.block_lr: the UNet's parameter {name} ({original}) is "
                             f"in block {index}; SDXL's UNet has {BLOCKS}")
        blocks[index].append((name, param))
    return blocks


def block_groups(unet: torch.nn.Module, rates: list[float]) -> list[dict[str, Any]]:
    """One parameter group per block with a rate (``unet_block<i>``); the blocks at 0 frozen."""
    groups = []
    for index, (params, lr) in enumerate(zip(unet_blocks(unet), rates)):
        if not params:
            continue
        if lr == 0:  # sd-scripts: "do not optimize when lr is 0"
            for _, param in params:
                param.requires_grad_(False)
            continue
        groups.append({"params": [p for _, p in params], "lr": lr,
                       "name": f"unet_block{index}"})
    return groups
