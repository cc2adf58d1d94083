"""LyCORIS adapters (LoCon, LoHa, LoKr, IA3, DoRA, GLoRA, BOFT, Diag-OFT) through the
lycoris-lora package.

On a transformer family (FLUX.1, SD 3.5, ...: ``FamilySpec.lycoris``) the adapters go on exactly
the modules of the family's LoRA (its lora role's ``target_modules``, by full path:
:func:`~trainer.methods.lycoris_presets.transformer_preset`) and the file names them by its
``lycoris_module_name`` (trainer/export/flow_lycoris.py says why and what reads it). The rest
of this note is the UNet families'.

The network is the one sd-scripts builds with ``--network_module=lycoris.kohya``:
``LycorisNetworkKohya`` finds the modules by their block's class (``Transformer2DModel``,
``ResnetBlock2D``, ``Downsample2D``, ``Upsample2D`` in the UNet; ``CLIPAttention`` and
``CLIPMLP`` in the text encoders) and by name (``conv_in``, ``conv_out``, the time embedding),
and ``apply_to`` routes each module's forward through its adapter. The package's preset
"full" also lists other architectures' block classes, one of which (``TimestepEmbedding``)
is also a diffusers SD UNet class, which then meets the time embedding's name target twice
(lycoris 4.1 stops on "duplicated lora name"); :data:`SD_PRESET` is "full" with only the
SD classes. IA3 follows its paper (Liu et al. 2022, "Few-Shot Parameter-Efficient
Fine-Tuning is Better and Cheaper than In-Context Learning", section 3.3): keys, values and
the feed-forward's inner activation (the input of its second layer); lycoris' own "ia3"
preset names the same layers, but as patterns anchored at the start of the module path,
which match none of a diffusers UNet's, so :data:`IA3_PRESET` anchors them at the end.

The adapters are registered as a submodule (``lycoris``) of the UNet and of each trained text
encoder, so the loop's placement, precision casting, gradient clipping, DDP wrapping, text
encoder freezing and the training state (trainer/run/state.py reads the models' parameters) treat
them as any trained parameter. The file is written by :mod:`trainer.export.lycoris`.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import torch

from trainer.config import TrainConfig
from trainer.methods.base import MethodBase

SD_TEXT_ENCODER_MODULES = ["CLIPAttention", "CLIPSdpaAttention", "CLIPMLP"]
SD_PRESET: dict[str, Any] = {
    "enable_conv": True,
    "unet_target_module": ["Transformer2DModel", "ResnetBlock2D", "Downsample2D", "Upsample2D"],
    "unet_target_name": ["conv_in", "conv_out", "time_embedding.linear_1",
                         "time_embedding.linear_2"],
    "text_encoder_target_module": SD_TEXT_ENCODER_MODULES,
    "text_encoder_target_name": [],
    "module_algo_map": {}, "name_algo_map": {}, "use_fnmatch": False, "exclude_name": [],
}
_FF_OUT, _FC2 = r".*\.ff\.net\.2$", r".*\.mlp\.fc2$"
IA3_PRESET: dict[str, Any] = {
    **SD_PRESET,
    "enable_conv": False,
    "unet_target_module": [],
    "unet_target_name": [r".*\.to_k$", r".*\.to_v$", _FF_OUT],
    "text_encoder_target_module": [],
    "text_encoder_target_name": [r".*\.k_proj$", r".*\.v_proj$", _FC2],
    "name_algo_map": {_FF_OUT: {"train_on_input": True}, _FC2: {"train_on_input": True}},
}
# apply_preset sets class attributes: one network is built at a time
_BUILD_LOCK = threading.Lock()


def network_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """``LycorisNetworkKohya``'s arguments for this config, with lycoris.kohya's defaults
    (conv_dim = network_dim and conv_alpha = network_alpha when unset)."""
    from trainer.export.lycoris_args import ALGOS, conv_rank  # network_type -> algo, its args

    net = cfg.network
    algo, args = ALGOS[net.network_type]
    conv_dim, conv_alpha = conv_rank(net)
    return {
        "multiplier": 1.0, "network_module": algo,
        "weight_decompose": args.get("dora_wd") == "True",  # as lycoris.kohya reads dora_wd
        "lora_dim": net.network_dim, "alpha": net.network_alpha,
        "conv_lora_dim": conv_dim, "conv_alpha": conv_alpha,
        "dropout": net.network_dropout or 0.0, "rank_dropout": net.rank_dropout or 0.0,
        "module_dropout": net.module_dropout or 0.0, "use_tucker": net.use_tucker,
        "use_scalar": net.use_scalar, "train_norm": net.train_norm,
        "factor": -1 if net.factor is None else net.factor,
        "decompose_both": net.decompose_both,
        # Diag-OFT / BOFT (lycoris.kohya reads an unset constraint as 0: unconstrained)
        "constraint": net.constraint or 0.0, "rescaled": net.rescaled,
        # None (not False) leaves lycoris' own choice for quantized layers when it is off
        "bypass_mode": True if net.bypass_mode else None,
    }


def build_network(cfg: TrainConfig, unet: torch.nn.Module,
                  text_encoders: list[torch.nn.Module],
                  targets: Optional[list[str]] = None) -> Any:
    """The lycoris network over ``unet`` and ``text_encoders`` (not applied yet); ``targets``:
    a transformer's module paths (its family's LoRA targets), else the UNet's preset."""
    from lycoris.kohya import LycorisNetworkKohya

    encoders: Any = text_encoders if len(text_encoders) > 1 else (
        text_encoders[0] if text_encoders else None)
    from trainer.methods.lycoris_presets import sd_preset, transformer_preset

    net = cfg.network
    if targets is not None:
        preset = transformer_preset(targets)
    else:
        preset = IA3_PRESET if net.network_type == "ia3" else sd_preset(
            net.lycoris_preset or "full")
    kwargs = network_kwargs(cfg)
    if next(unet.parameters()).is_meta:
        # trainer/advisor/footprint.py's weightless model: DoRA's scale is the norm of each weight's
        # rows, which has no value there; the estimate counts DoRA as the LoRA under it
        kwargs["weight_decompose"] = False
    with _BUILD_LOCK:
        LycorisNetworkKohya.apply_preset(preset)
        return LycorisNetworkKohya(encoders, unet, warn_on_unmatched=False, **kwargs)


def transformer_targets(cfg: TrainConfig, model: Any) -> Optional[list[str]]:
    """A transformer family's LoRA targets (its lora role's ``target_modules`` for
    ``network.train_blocks``), which its LyCORIS adapts too; None for a UNet family."""
    from trainer.families import role, spec

    s = spec(model.version)
    if s.denoiser != "transformer":
        return None
    lora = role(model.version, "lora")
    if not hasattr(lora, "lycoris_module_name"):  # the family's LyCORIS file has no names
        raise ValueError(f"network.network_type = {cfg.network.network_type!r}: {s.label} "
                         f"names no LyCORIS module (its lora role has no lycoris_module_name); "
                         f"use 'lora'")
    return lora.target_modules(model.denoiser, cfg.network.train_blocks)


def _owned_by(root: torch.nn.Module, loras: list[Any]) -> list[Any]:
    ids = {id(m) for m in root.modules()}
    return [lora for lora in loras if id(lora.org_module[0]) in ids]


def attach(root: torch.nn.Module, loras: list[Any]) -> list[torch.nn.Parameter]:
    """Register ``loras`` under ``root.lycoris`` on root's device; returns their parameters."""
    device = next(root.parameters()).device
    holder = torch.nn.ModuleDict({lora.lora_name: lora for lora in loras}).to(device)
    root.add_module("lycoris", holder)
    return list(holder.parameters())


class LycorisMethod(MethodBase):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.loras: list[Any] = []
        self.saved_encoders: list[str] = []

    def prepare(self, model: Any) -> list[dict[str, Any]]:
        """Freeze the base model, apply the lycoris network, return the parameter groups."""
        from trainer.methods.lora import family_text_encoders

        opt, net = self.cfg.optimizer, self.cfg.network
        encoders = self.trained_text_encoders(model)
        for module in (model.denoiser, model.vae, *(e for _, e, _ in family_text_encoders(model))):
            module.requires_grad_(False)
        network = build_network(self.cfg, model.denoiser, [e for _, e, _ in encoders],
                                transformer_targets(self.cfg, model))
        network.apply_to([e for _, e, _ in encoders], model.denoiser,
                         apply_text_encoder=bool(encoders), apply_unet=net.train_unet)
        if net.network_weights:  # continue from a file
            from trainer.methods.lora_weights import load_lycoris_weights

            load_lycoris_weights(self.cfg, model, list(network.loras), [n for n, _, _ in encoders])
        groups: list[dict[str, Any]] = []
        if net.train_unet:
            owned = _owned_by(model.denoiser, network.loras)
            groups.append({"params": attach(model.denoiser, owned),
                           "lr": opt.unet_lr or opt.learning_rate, "name": "unet"})
        for name, encoder, lr in encoders:
            groups.append({"params": attach(encoder, _owned_by(encoder, network.loras)),
                           "lr": lr, "name": name})
        self.loras = list(network.loras)
        self.trains_text_encoder = bool(encoders)
        self.saved_encoders = [name for name, _, _ in encoders]
        groups = [g for g in groups if g["params"]]
        return self.nonempty(groups)

    def save(self, path, model: Any, facts: Any, final: bool = True):
        from trainer.export.lycoris import save_lycoris
        from trainer.families import spec

        if spec(model.version).denoiser == "transformer":  # the family's names, flow metadata
            from trainer.methods.flow_lora import save_flow_run_lycoris

            return save_flow_run_lycoris(path, model, self.cfg, facts, self.save_dtype,
                                         self.loras, self.saved_encoders)

        encoders = [(name, getattr(model, name)) for name in self.saved_encoders]
        return save_lycoris(path, self.loras, model.denoiser, encoders, self.cfg, facts,
                            self.save_dtype)
