"""What a step's law (:mod:`trainer.advisor.law`) is kept under, and the values its two
simulations run at.

A law holds for every bucket and batch (batch 1 has its own), and for every LoRA rank above 1
where the rank enters each tensor linearly: peft's LoRA (``network_type = "lora"``) without
block-wise ranks, alphas or learning-rate weights, DyLoRA or starting weights. Its key is
then the model's configs, the mode, the dtype, checkpointing, batch 1 or more and the network
settings that shape a step: the settings of the mode, less the ranks and what only sets
learning rates; of the alphas only whether each equals its rank (then the lean LoRA forward
skips its scaling, :mod:`trainer.methods.fast_lora`). Elsewhere the ranks and alphas are part
of the key. Textual inversion's key has no network: its embeddings are what trains.
"""
from __future__ import annotations

import json
from typing import Any, Optional

# Settings that change learning rates or what happens after a step, not a step's tensors.
LR_ONLY = ("loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio",
           "scale_weight_norms", "stop_text_encoder_training")
# With any of these set, ranks come from elsewhere (per block, a file) or not linearly.
RANKS_FIXED = ("block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas",
               "down_lr_weight", "mid_lr_weight", "up_lr_weight", "network_weights",
               "dylora_unit")
FIRST_RANK = 4


def ranks_vary(cfg: Any) -> bool:
    """Whether a law follows the ranks (rank 1 runs other operations: a dimension of 1 lets
    PyTorch view a tensor that it copies otherwise)."""
    net = cfg.network
    return (cfg.mode == "lora" and net.network_type == "lora" and net.network_dim > 1
            and (net.conv_dim is None or net.conv_dim > 1)
            and all(getattr(net, name) is None for name in RANKS_FIXED))


def _conv_alpha_is_rank(net: Any) -> bool:
    return net.conv_alpha is None or net.conv_alpha == net.conv_dim


def network_key(cfg: Any) -> Optional[dict[str, Any]]:
    """The network settings that shape a step of ``cfg``'s mode (textual inversion: none,
    its embeddings are what trains)."""
    if cfg.mode == "textual_inversion":
        return None
    net = cfg.network
    fields = type(net).model_fields

    def read_by_mode(name: str) -> bool:
        extra = fields[name].json_schema_extra if name in fields else None
        modes = (extra or {}).get("ui", {}).get("modes") if isinstance(extra, dict) else None
        return modes is None or cfg.mode in modes
    data = {k: v for k, v in net.model_dump(mode="json").items()
            if k not in LR_ONLY and read_by_mode(k)}
    if ranks_vary(cfg):
        data["network_dim"] = "rank"
        data["network_alpha"] = "rank" if net.network_alpha == net.network_dim else "other"
        if net.conv_dim is not None:
            data["conv_dim"] = "conv rank"
            data["conv_alpha"] = "conv rank" if _conv_alpha_is_rank(net) else "other"
    return data


def step_key(configs: Any, cfg: Any, dtype: Any, checkpointing: bool, batch: int) -> str:
    """A law's key; batch 1 has a law of its own (as rank 1: PyTorch views what it copies
    at larger batches)."""
    return json.dumps(["step-law", configs.key, cfg.mode, network_key(cfg), str(dtype),
                       checkpointing, "batch 1" if batch == 1 else "batch 2+"], sort_keys=True)


def varied(cfg: Any, batch: int) -> tuple[bool, ...]:
    """Which of batch, latent height, latent width, rank and convolution rank the law follows."""
    lora = ranks_vary(cfg)
    return (batch > 1, True, True, lora, lora and cfg.network.conv_dim is not None)


def first_values(configs: Any, batch: int) -> tuple[int, ...]:
    """The first simulation's values: batch 1 or 2, a latent of 8 x the UNet's downsampling a
    side (SD: 64, 512 px), rank 4; powers of two, so that the coefficients are exact."""
    side = 8 * 2 ** (len(configs.unet["down_block_types"]) - 1)
    return (1 if batch == 1 else 2, side, side, FIRST_RANK, FIRST_RANK)


def recording_changes(cfg: Any, values: tuple[int, ...]) -> dict[str, Any]:
    """The settings a simulation at ``values`` runs with: the ranks, and alphas that equal
    them where ``cfg``'s do (else half of them)."""
    if not ranks_vary(cfg):
        return {}
    net, rank, conv = cfg.network, values[3], values[4]
    changes: dict[str, Any] = {
        "network.network_dim": rank,
        "network.network_alpha": float(rank if net.network_alpha == net.network_dim
                                       else rank / 2)}
    if net.conv_dim is not None:
        changes["network.conv_dim"] = conv
        changes["network.conv_alpha"] = None if _conv_alpha_is_rank(net) else conv / 2
    return changes


def with_changes(cfg: Any, changes: dict[str, Any]) -> Any:
    """``cfg`` with dotted ``changes`` applied, validated like every config."""
    from trainer.config import files as config_io

    if not changes:
        return cfg
    data = config_io.to_dict(cfg)
    for path, value in changes.items():
        section, _, name = path.rpartition(".")
        (data.setdefault(section, {}) if section else data)[name] = value
    return config_io.from_dict(data, "advisor")


def rank_values(cfg: Any) -> tuple[int, int]:
    """(rank, convolution rank) of ``cfg`` for a law (1 where the law does not follow it)."""
    if not ranks_vary(cfg):
        return (1, 1)
    net = cfg.network
    return (net.network_dim, net.conv_dim or 1)
