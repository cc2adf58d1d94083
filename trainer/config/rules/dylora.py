"""What ``network.dylora_unit`` (DyLoRA, trainer/methods/dylora.py) cannot be combined with,
refused with the reason.

DyLoRA follows sd-scripts' ``networks/dylora.py``: a plain LoRA network whose modules
(``DyLoRAModule``) read the rank, the alpha, ``conv_dim`` (which must equal ``network_dim``)
and ``unit``, and the LoRA+ ratios; the convolutions train at ``network_alpha`` (sd-scripts
parses ``conv_alpha`` but never passes it on). The module has no dropout, the network no
max-norm (sd-scripts' train_network turns ``scale_weight_norms`` off for it with a warning), no
block-wise rates or ranks, and it rebuilds a network from a file with unit 1.
"""

from __future__ import annotations

from typing import Any

from trainer.config.lora_blocks import DIM_KEYS, LR_KEYS

# setting -> why sd-scripts' DyLoRA cannot honour it
UNREAD = {
    "network_dropout": "DyLoRAModule has no dropout",
    "rank_dropout": "DyLoRAModule has no dropout",
    "module_dropout": "DyLoRAModule has no dropout",
    "scale_weight_norms": "DyLoRANetwork has no max-norm (sd-scripts turns it off for it)",
    "dim_from_weights": "sd-scripts rebuilds a DyLoRA network from a file with unit 1; set "
                        "network_dim to the file's rank instead",
    **dict.fromkeys((*LR_KEYS, "block_lr_zero_threshold", *DIM_KEYS),
                    "block-wise rates and ranks are networks.lora options, which "
                    "networks.dylora does not read"),
}


def dylora_problems(net: Any) -> list[str]:
    """The problems of a [network] section ``net`` with ``dylora_unit`` set (the families that
    have DyLoRA are its ``families`` hint: the UNet families')."""
    unit = net.dylora_unit
    if unit is None:
        return []
    if net.network_type != "lora":
        return [f"network.dylora_unit: DyLoRA is sd-scripts' networks.dylora, a plain LoRA; "
                f"network_type = {net.network_type!r} cannot take it; use 'lora' or unset "
                f"dylora_unit"]
    problems = []
    if net.network_dim % unit:
        problems.append(f"network.dylora_unit = {unit}: network.network_dim "
                        f"({net.network_dim}) must be a multiple of it")
    if net.conv_dim is not None and net.conv_dim != net.network_dim:
        problems.append(f"network.conv_dim = {net.conv_dim} with network.dylora_unit: "
                        f"sd-scripts' DyLoRA needs conv_dim equal to network_dim "
                        f"({net.network_dim})")
    if net.conv_alpha is not None and net.conv_alpha != net.network_alpha:
        problems.append(f"network.conv_alpha = {net.conv_alpha:g} with network.dylora_unit: "
                        f"sd-scripts' DyLoRA trains the convolutions at network_alpha "
                        f"({net.network_alpha:g}); unset conv_alpha")
    for key, why in UNREAD.items():
        if getattr(net, key) not in (None, False):
            problems.append(f"network.{key} cannot be used with network.dylora_unit: {why}; "
                            f"unset one of them")
    return problems
