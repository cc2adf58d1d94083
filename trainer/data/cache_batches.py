"""How the caches encode: batches sized to memory, in bf16 where the run's base weights are,
so that the first step comes sooner.

The latent cache encodes one bucket at a time in batches bounded by an estimate of the VAE
encoder's activations: about 5.3 x ``block_out_channels[0]`` values per pixel measured on SD's
VAE (2.7 KB per pixel in fp32; a 512 px image needs 0.7 GB, a 1024 px one 2.8 GB), taken as 6x,
plus the mid-block attention's score matrix. The text cache encodes its captions in batches
bounded the same way by the encoders' widths and token counts. The budget is half of what is
free: the device's free memory on a GPU, the available RAM on the CPU (a shared machine keeps
the other half).

On a CPU run whose base weights are bf16 (trainer/run/cpu_precision.py) the VAE encodes under
bf16 autocast: a few large batches pay the weight casts once per batch; the VAE itself stays
fp32 for the samples' decode. The text encoders are already stored in bf16 there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Optional

import torch

from trainer.system.device import memory_free

ACTIVATION_FACTOR = 6  # VAE encoder values per pixel per block_out_channels[0]
MAX_LATENT_BATCH = 32
MAX_TEXT_BATCH = 64
FALLBACK_BUDGET = 2 << 30  # where the free memory is unknown
Size = tuple[int, int]  # (width, height), as buckets are


def budget(info: Any) -> int:
    """Bytes one cache batch may use: half of the free memory."""
    free = memory_free(info)
    return FALLBACK_BUDGET if not free else free // 2


def latent_bytes(vae_config: Any, size: Size, element_size: int) -> int:
    """Estimated peak of one image's VAE encode at ``size`` (width, height)."""
    channels = _get(vae_config, "block_out_channels", (128,))[0]
    pixels = size[0] * size[1]
    tokens = pixels // 64 if _get(vae_config, "mid_block_add_attention", True) else 0
    return (ACTIVATION_FACTOR * channels * pixels + tokens * tokens) * element_size


def latent_batches(vae_config: Any, budget_bytes: int,
                   element_size: int = 4) -> Callable[[Size], int]:
    """The rows per encode call for each bucket (the latent cache halves it when an image's
    mirror is encoded in the same call)."""

    def for_bucket(size: Size) -> int:
        one = latent_bytes(vae_config, size, element_size)
        return max(1, min(MAX_LATENT_BATCH, budget_bytes // max(one, 1)))

    return for_bucket


def text_bytes(encoders: list[tuple[Any, int]], element_size: int) -> int:
    """Estimated peak of one caption through every ``(config, tokens)`` encoder: each layer's
    hidden states kept (clip_skip reads them), one MLP and one attention score matrix."""
    total = 0
    for config, tokens in encoders:
        width = _first(config, ("hidden_size", "d_model"), 768)
        layers = _first(config, ("num_hidden_layers", "num_layers"), 12)
        inner = _first(config, ("intermediate_size", "d_ff"), 4 * width)
        heads = _first(config, ("num_attention_heads", "num_heads"), 12)
        total += ((layers + 1) * tokens * width + tokens * inner + heads * tokens * tokens) \
            * element_size
    return total


def text_batch(encoders: list[tuple[Any, int]], budget_bytes: int, element_size: int) -> int:
    one = text_bytes(encoders, element_size)
    return max(1, min(MAX_TEXT_BATCH, budget_bytes // max(one, 1)))


def latent_autocast(backend: str, dtype: Any) -> contextlib.AbstractContextManager:
    """bf16 autocast for the VAE encode on a CPU run with bf16 base weights; else nothing."""
    if backend == "cpu" and dtype == torch.bfloat16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def latent_encoder(encode: Callable[[torch.Tensor], torch.Tensor], backend: str,
                   dtype: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``encode`` under :func:`latent_autocast`, its latents back in fp32 for the cache."""

    def run(pixels: torch.Tensor) -> torch.Tensor:
        with latent_autocast(backend, dtype):
            return encode(pixels).float()

    return run


def latent_id(vae_id: str, backend: str, dtype: Any) -> str:
    """The disk cache's VAE id: bf16-encoded latents are not an fp32 run's."""
    return vae_id + ("|bf16" if backend == "cpu" and dtype == torch.bfloat16 else "")


def text_encoder_configs(model: Any) -> list[tuple[Any, int]]:
    """``(config, tokens per caption)`` of each of the model's text encoders."""
    from trainer.families import family_of

    out = []
    for _, encoder, tokenizer in family_of(model).text_encoders(model):
        config = getattr(encoder, "config", None)
        tokens = int(getattr(tokenizer, "model_max_length", 77) or 77)
        if tokens > 4096:  # a tokenizer without a limit: T5's length is the run's
            tokens = int(getattr(model, "t5_max_length", 0) or 512)
        out.append((config, tokens))
    return out


def element_size(module: Any) -> int:
    param: Optional[torch.Tensor] = next(iter(module.parameters()), None)
    return 4 if param is None else param.element_size()


def _get(config: Any, name: str, default: Any) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _first(config: Any, names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = _get(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default
