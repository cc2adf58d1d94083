"""The [network] options that the rest of the config rules out, refused with the reason.

:func:`problems`: an option that the chosen ``network.network_type`` does not read
(``NETWORK_OPTIONS``) and the LyCORIS preset's (:mod:`trainer.config.rules.lycoris`).
:func:`network_extra_problems`: LoRA+, block-wise rates and ranks, ``network_weights`` and DyLoRA
(:mod:`trainer.config.sections.lora`); the section's validator checks what does not
depend on the model family at load, :func:`trainer.config.rules.family.family_problems` (at load
for a named family, and in the run once a model given by path is detected) the rest.
"""

from __future__ import annotations

from typing import Any, Optional

from trainer.config.lora_blocks import BLOCK_COUNTS, DIM_KEYS, LR_KEYS, block_problems

LORAPLUS = ("loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio")
BLOCK_KEYS = (*LR_KEYS, "block_lr_zero_threshold", *DIM_KEYS)

# Network options and the network types that read them: peft's LoRA for "lora", lycoris-lora's
# modules for the rest (lycoris/modules/*.py: LoConModule, LohaModule, LokrModule, IA3Module,
# and NormModule for train_norm).
NETWORK_OPTIONS = {
    "factor": ("lokr",), "decompose_both": ("lokr",),
    "use_tucker": ("locon", "loha", "lokr", "dora"),
    "use_scalar": ("locon", "loha", "lokr", "dora", "glora"),
    # "lora": sd-scripts' LoRAModule meaning (trainer/methods/lora_regularize.py)
    "rank_dropout": ("lora", "locon", "loha", "lokr", "dora", "glora", "diag-oft"),
    "module_dropout": ("lora", "locon", "loha", "lokr", "ia3", "dora", "glora", "boft",
                       "diag-oft"),
    # IA3 scales the channels of named layers (keys, values, feed-forward): it has no rank
    # (network_dim / network_alpha are ignored), no convolution rank, no dropout on a low-rank
    # path, and no block whose norm layers train_norm would find
    "train_norm": ("locon", "loha", "lokr", "dora", "glora", "boft", "diag-oft"),
    # OFT's convolution rank is its block size there; its alpha is the constraint (BOFTModule,
    # DiagOFTModule)
    "conv_dim": ("lora", "locon", "loha", "lokr", "dora", "glora", "boft", "diag-oft"),
    "conv_alpha": ("lora", "locon", "loha", "lokr", "dora", "glora"),
    "network_dropout": ("lora", "locon", "loha", "lokr", "dora"),
    "constraint": ("boft", "diag-oft"), "rescaled": ("boft", "diag-oft"),
    # network.lycoris_preset picks the modules; ia3 is lycoris' "ia3" preset itself
    "lycoris_preset": ("locon", "loha", "lokr", "dora", "glora", "boft", "diag-oft"),
    # LycorisBaseModule's bypass forward; LoConModule's skips DoRA's weight decomposition
    "bypass_mode": ("locon", "loha", "lokr", "glora", "boft", "diag-oft"),
}


def problems(cfg: Any) -> list[str]:
    """A network option that the chosen network.network_type does not read, then the LyCORIS
    preset's problems (LoRA mode only)."""
    from trainer.config.rules.lycoris import problems as lycoris_problems

    net = cfg.network
    if cfg.mode != "lora":
        return []
    for name, types in NETWORK_OPTIONS.items():
        value = getattr(net, name)
        if value is None or value is False or net.network_type in types:
            continue
        return [f"network.{name} is set but network.network_type = {net.network_type!r} does "
                f"not use it (it applies to {', '.join(types)}); unset it or change "
                f"network_type"]
    return lycoris_problems(cfg)


def _set(net: Any, keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if getattr(net, k) not in (None, False)]


def network_extra_problems(net: Any, family: Optional[str]) -> list[str]:
    """What the LoRA+ / block-wise / network_weights settings of the [network] section ``net``
    cannot do; ``family`` None (not known yet): the checks that do not depend on it."""
    from trainer.config.rules.dylora import dylora_problems  # network.dylora_unit

    problems = dylora_problems(net)
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
    if family is not None and family not in BLOCK_COUNTS:
        return problems  # the block settings' families hint refuses them
    return problems + block_problems(net, family)

