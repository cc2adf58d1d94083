"""What a FLUX.2 config cannot ask, refused when it loads (torch-free; the config layer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

DEV_WIDTH = 6144  # FLUX.2 [dev]'s hidden width: 48 heads x 128 (32B parameters)


def transformer_width(path: str) -> Optional[int]:
    """The hidden width of the FLUX.2 transformer at ``path`` (a diffusers folder's config, a
    single file's header), None where it cannot be read (an embedded twin, a missing path: the
    loader names those)."""
    from trainer.families.common.files import ModelFileError, read_safetensors_header
    from trainer.families.flux2.detect import header_info

    found = Path(path).expanduser()
    try:
        if found.is_dir():
            config = json.loads((found / "transformer" / "config.json").read_text("utf-8"))
            return int(config["num_attention_heads"]) * int(config["attention_head_dim"])
        if found.suffix.lower() == ".safetensors" and found.is_file():
            info = header_info(read_safetensors_header(found).tensors)
            if info is not None:
                return info.config["num_attention_heads"] * info.config["attention_head_dim"]
    except (OSError, ValueError, KeyError, TypeError, ModelFileError):
        return None
    return None


def dev_dreambooth_problem(cfg: Any) -> list[str]:
    """A full fine-tune of the published FLUX.2 [dev] on one GPU: its 32B weights in bf16
    (64 GB), their gradients and AdamW's state (about 10x that) fit no single card; FSDP shards
    them over several (trainer/run/fsdp.py). Tied to the real width, so the tiny dev twin
    fine-tunes on one process as any twin does."""
    if cfg.mode != "dreambooth" or cfg.training.distributed == "fsdp":
        return []
    if transformer_width(cfg.model.pretrained_model_name_or_path) != DEV_WIDTH:
        return []
    return ["mode = 'dreambooth' on FLUX.2 [dev] on one GPU: a full fine-tune of its 32B "
            "transformer holds the weights, their gradients and the optimizer's state "
            "(several hundred GB), more than any single GPU; train a LoRA (mode = 'lora'), or "
            "shard the fine-tune over several GPUs with training.distributed = 'fsdp' and "
            "training.num_processes > 1"]


def problems(cfg: Any, spec: Any, precision: Optional[str] = None) -> list[str]:
    """FLUX.2's own refusals: its LoRA trains the transformer only (as musubi-tuner's and
    diffusers' ``train_dreambooth_lora_flux2_klein.py`` do), so the file holds no Qwen3
    layers; dev's full fine-tune needs FSDP."""
    if cfg.mode == "lora" and cfg.network.train_text_encoder:
        return [f"network.train_text_encoder = true: a {spec.label} LoRA trains the transformer "
                f"only (as musubi-tuner and diffusers' example; ComfyUI and diffusers read no "
                f"Qwen3 LoRA of it); turn it off, or train the text encoder with DreamBooth"]
    return dev_dreambooth_problem(cfg)
