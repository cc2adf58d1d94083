"""The network options of :mod:`trainer.config.sections.network_extra` that cannot work with the
rest of the config, refused with the reason: the section's validator checks what does not depend
on the model family at load; :func:`trainer.config.family_rules.family_problems` (at load for a
named family, and in the run once a model given by path is detected) checks the rest."""

from __future__ import annotations

from typing import Any, Optional

from trainer.config.lora_blocks import DIM_KEYS, LR_KEYS, block_problems

LORAPLUS = ("loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio")
BLOCK_KEYS = (*LR_KEYS, "block_lr_zero_threshold", *DIM_KEYS)
SD_FAMILIES = ("sd1", "sd2", "sdxl")


def _set(net: Any, keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if getattr(net, k) not in (None, False)]


def network_extra_problems(net: Any, family: Optional[str]) -> list[str]:
    """What the LoRA+ / block-wise / network_weights settings of the [network] section ``net``
    cannot do; ``family`` None (not known yet): the checks that do not depend on it."""
    from trainer.config.dylora_rules import dylora_problems  # network.dylora_unit

    problems = dylora_problems(net, family)
    plus, blocks = _set(net, LORAPLUS), _set(net, BLOCK_KEYS)
    if plus and net.network_type != "lora":
        problems.append(f"network.{plus[0]}: LoRA+ raises the rate of LoRA's B (lora_up) "
                        f"matrices; network_type = {net.network_type!r} has none; use 'lora' "
                        f"or unset it")
    if blocks and net.network_type != "lora":
        problems.append(f"network.{blocks[0]}: block-wise rates and ranks are sd-scripts' "
                        f"networks.lora options; use network_type = 'lora' or unset it")
    if net.dim_from_weights and net.network_type != "lora":
        problems.append(f"network.dim_from_weights reads LoRA ranks (lora_down); for "
                        f"network_type = {net.network_type!r} set network_dim / conv_dim to "
                        f"the file's and unset it")
    if net.dim_from_weights and net.network_weights is None:
        problems.append("network.dim_from_weights needs network.network_weights (the file "
                        "to take the ranks from)")
    if family is not None and family not in SD_FAMILIES:
        for key in blocks + _set(net, ("network_weights",)):
            problems.append(f"network.{key} is for the SD families (SD 1.x, 2.x, SDXL UNet "
                            f"blocks and files); unset it for this model")
        return problems
    return problems + block_problems(net, family)

