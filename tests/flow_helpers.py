"""What the FLUX.1 tests share."""

import torch

FLUX_LINEAR1_SIZES = (3072, 3072, 3072, 12288)


def scale_diffusers_flux_split(monkeypatch) -> None:
    """diffusers 0.42's FLUX converter splits ``linear1`` with FLUX.1's fixed sizes (3072 x 3 +
    12288); scale those sizes to the file's width so that the rest of its code runs as is on the
    tiny model."""
    real = torch.split

    def split(tensor, sizes, dim=0):
        if isinstance(sizes, (tuple, list)) and tuple(sizes) == FLUX_LINEAR1_SIZES \
                and tensor.shape[0] != sum(sizes):
            width = tensor.shape[0] // 7  # 3 x width + 4 x width (mlp_ratio 4)
            sizes = (width, width, width, 4 * width)
        return real(tensor, sizes, dim)

    monkeypatch.setattr(torch, "split", split)


def randomize_lora(*modules, seed: int = 3, scale: float = 0.3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in modules:
            for name, p in module.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)


def flux_lora_file(path, seed: int = 3, rank: int = 4, alpha: float = 2.0,
                   linear1: bool = False):
    """A FLUX.1 LoRA on the tiny model as the trainer writes it (kohya form on BFL names: the
    double and single blocks and CLIP-L), random, fp32. ``linear1`` off by default: diffusers'
    converter refuses it at the tiny width before any split (an assert on FLUX.1's sizes)."""
    from peft import LoraConfig, inject_adapter_in_model

    from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora
    from trainer.families.common.tiny_mmdit import build_flux_components
    from trainer.families.flux.lora import (
        CLIP_TARGETS,
        DOUBLE_PARTS,
        SINGLE_PARTS,
        flux_kohya_state_dict,
        flux_target_modules,
    )

    comps = build_flux_components()
    tr, clip = comps["transformer"], comps["text_encoder"]
    parts = [p for p in (*DOUBLE_PARTS, *SINGLE_PARTS) if linear1 or p != "linear1"]
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha,
                                       target_modules=flux_target_modules(tr, parts=parts)), tr)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=CLIP_TARGETS),
                            clip)
    randomize_lora(tr, clip, seed=seed)
    tensors = flux_kohya_state_dict(tr, clip, dtype=torch.float32)
    return save_flow_lora(path, tensors, FlowLoraInfo("flux1", "dev"),
                          {"ss_network_dim": rank, "ss_network_alpha": alpha})


def sd3_lora_file(path, seed: int = 3, rank: int = 4, alpha: float = 2.0):
    """An SD 3.5 LoRA on the tiny model as the trainer writes it (``transformer.*``, CLIP-L and
    CLIP-G, alpha / rank folded into lora_B), random, fp32."""
    from peft import LoraConfig, inject_adapter_in_model

    from trainer.families.common.mmdit_lora_file import FlowLoraInfo, save_flow_lora
    from trainer.families.common.tiny_mmdit import build_sd3_components
    from trainer.families.flux.lora import CLIP_TARGETS
    from trainer.families.sd3.lora import sd3_state_dict, sd3_target_modules

    comps = build_sd3_components()
    tr = comps["transformer"]
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha,
                                       target_modules=sd3_target_modules(tr)), tr)
    for key in ("text_encoder", "text_encoder_2"):
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha,
                                           target_modules=CLIP_TARGETS), comps[key])
    randomize_lora(tr, comps["text_encoder"], comps["text_encoder_2"], seed=seed)
    tensors = sd3_state_dict(tr, comps["text_encoder"], comps["text_encoder_2"],
                             dtype=torch.float32)
    return save_flow_lora(path, tensors, FlowLoraInfo("sd3", "5-medium"),
                          {"ss_network_dim": rank, "ss_network_alpha": alpha})
