"""LoRA through peft: what is injected, what trains, and how it is saved (kohya format)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from peft import LoraConfig, inject_adapter_in_model

from trainer.config import TrainConfig
from trainer.families import family_of, role, spec
from trainer.methods.base import MethodBase
from trainer.methods.fast_lora import lean_forward

# The Linear (and 1x1 conv) layers of the UNet's transformer blocks, as sd-scripts targets them.
UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
                "ff.net.2"]
# The 3x3 convolutions of the ResNet blocks and the resamplers (LoCon, network.conv_dim).
UNET_CONV_TARGETS = ["conv1", "conv2", "conv_shortcut", "downsamplers.0.conv",
                     "upsamplers.0.conv"]
TEXT_ENCODER_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
# T5's attention and gated feed-forward Linears (sd-scripts: T5Attention, T5DenseGatedActDense)
T5_TARGETS = ["q", "k", "v", "o", "wi_0", "wi_1", "wo"]


def unet_lora_config(cfg: TrainConfig) -> LoraConfig:
    net = cfg.network
    targets = list(UNET_TARGETS)
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    if net.conv_dim is not None:
        targets += UNET_CONV_TARGETS
        conv_alpha = net.conv_alpha if net.conv_alpha is not None else float(net.conv_dim)
        for name in UNET_CONV_TARGETS:
            rank_pattern[name] = net.conv_dim
            alpha_pattern[name] = conv_alpha
    return LoraConfig(
        r=net.network_dim, lora_alpha=net.network_alpha, lora_dropout=net.network_dropout or 0.0,
        init_lora_weights="gaussian", target_modules=targets, rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
    )


def text_encoder_lora_config(cfg: TrainConfig, t5: bool = False) -> LoraConfig:
    net = cfg.network
    return LoraConfig(
        r=net.network_dim, lora_alpha=net.network_alpha, lora_dropout=net.network_dropout or 0.0,
        init_lora_weights="gaussian", target_modules=T5_TARGETS if t5 else TEXT_ENCODER_TARGETS,
    )


def denoiser_lora_config(cfg: TrainConfig, model: Any) -> LoraConfig:
    """The UNet's LoRA, or the transformer's of FLUX.1 / SD 3.5 on sd-scripts' modules
    (trainer/families/flux/lora.py and sd3_lora.py name them; full paths, which peft matches
    exactly)."""
    if spec(model.version).denoiser == "unet":
        from trainer.methods.lora_groups import block_lora_config  # block_dims, lr weights

        return block_lora_config(cfg, model.denoiser, model.version, UNET_TARGETS,
                                 UNET_CONV_TARGETS) or unet_lora_config(cfg)
    net = cfg.network
    targets = role(model.version, "lora").target_modules(model.denoiser, net.train_blocks)
    return LoraConfig(r=net.network_dim, lora_alpha=net.network_alpha,
                      lora_dropout=net.network_dropout or 0.0, init_lora_weights="gaussian",
                      target_modules=targets)


def lora_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for n, p in module.named_parameters() if "lora_" in n]


class LoraMethod(MethodBase):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.saved_encoders: list[str] = []
        self.trained_roots: list[torch.nn.Module] = []

    def prepare(self, model: Any) -> list[dict[str, Any]]:
        """Freeze the base model, inject the adapters and return the parameter groups."""
        opt = self.cfg.optimizer
        encoders = self.trained_text_encoders(model)
        for module in (model.denoiser, model.vae, *(e for _, e, _ in family_text_encoders(model))):
            module.requires_grad_(False)
        from trainer.methods.lora_groups import network_groups  # LoRA+, block-wise rates
        from trainer.methods.lora_weights import NetworkWeights  # network_weights

        weights = NetworkWeights.open(self.cfg, model, ["unet", *(n for n, _, _ in encoders)])
        groups: list[dict[str, Any]] = []
        if self.cfg.network.train_unet:
            model.denoiser.add_adapter((weights and weights.config("unet", model.denoiser))
                                   or denoiser_lora_config(self.cfg, model))
            groups += network_groups(self.cfg, "unet", model.denoiser,
                                     opt.unet_lr or opt.learning_rate, model.version)
        t5 = family_of(model).t5_slot()
        for name, encoder, lr in encoders:
            inject_adapter_in_model((weights and weights.config(name, encoder))
                                    or text_encoder_lora_config(self.cfg, t5=name == t5),
                                    encoder)
            groups += network_groups(self.cfg, name, encoder, lr)
        self.trains_text_encoder = bool(encoders)
        self.saved_encoders = [name for name, _, _ in encoders]
        trained = [("unet", model.denoiser)] if self.cfg.network.train_unet else []
        trained += [(name, encoder) for name, encoder, _ in encoders]
        if weights is not None:
            weights.load(trained)  # before the lean forward reads each layer's scale
        for network in (model.denoiser, *(e for _, e, _ in encoders)):
            lean_forward(network)  # peft's layers and maths, fewer tensors and less Python
        from trainer.methods.lora_regularize import add_dropout  # sd-scripts' rank/module

        net = self.cfg.network
        add_dropout([root for _, root in trained], net.rank_dropout, net.module_dropout)
        self.trained_roots = [root for _, root in trained]
        return self.nonempty(groups)

    def after_step(self, model: Any, step: int) -> Optional[str]:
        """The base's (text encoder freezing), then max-norm (network.scale_weight_norms)."""
        note = super().after_step(model, step)
        max_norm = self.cfg.network.scale_weight_norms
        if max_norm is None:
            return note
        from trainer.methods.lora_regularize import apply_max_norm

        scaled, mean, top = apply_max_norm(self.trained_roots, max_norm)
        self.max_norm_stats = {"max_norm/keys_scaled": scaled,
                               "max_norm/average_key_norm": mean, "max_norm/max_key_norm": top}
        line = (f"max-norm: {scaled} modules scaled to {max_norm:g} (mean norm {mean:.4g}, "
                f"max {top:.4g})") if scaled else None
        return "; ".join(x for x in (note, line) if x) or None

    def save(self, path, model: Any, facts: Any, final: bool = True):
        from trainer.export.lora import save_lora

        if spec(model.version).denoiser == "transformer":  # the family's own LoRA form
            from trainer.methods.flow_lora import save_flow_run_lora

            return save_flow_run_lora(path, model, self.cfg, facts, self.save_dtype,
                                      self.saved_encoders)
        # a text encoder's LoRA stays in the file after stop_text_encoder_training froze it
        te, te2 = (getattr(model, n) if n in self.saved_encoders else None
                   for n in ("text_encoder", "text_encoder_2"))
        return save_lora(path, model.denoiser if self.cfg.network.train_unet else None, te,
                         self.cfg, facts, self.save_dtype, text_encoder_2=te2)


def family_text_encoders(model: Any) -> list[tuple[str, Any, Any]]:
    return family_of(model).text_encoders(model)
