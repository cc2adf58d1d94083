"""bf16 base weights on the CPU: chosen by ``auto`` where they measure faster, and safe for
every network type.

With ``mixed_precision = "bf16"`` the frozen weights of the UNet / transformer and the text
encoders are stored in bf16 (half the resident memory) and the trained parameters and the
optimizer state stay fp32, as on GPUs with a ``weight_dtype``; autocast runs the matmuls in bf16.
On a CPU with bf16 units (AMX, AVX512-BF16) that is twice as fast as fp32 at 256 px for an
SD 1.5 UNet, but slower at 64 px, so ``auto`` decides by a short probe on the loaded model at
the run's resolution (cached per CPU in trainer/system/cpu_bf16.py) and logs why. A probe that
other processes slowed (they used half a core or more meanwhile, as trainer/system/threads.py
counts it) decides this run only and is not kept: on 2 cores next to busy processes a 2-thread
probe measured bf16 1.42x faster for an SD 1.5 UNet at 256 px, a 1-thread one 2.7x, and a ratio
pushed near 1 and kept would choose for every later run.

:func:`keep_norms_fp32` fixes "mixed dtype (CPU): expect parameter to have scalar type of
Float": torch's CPU layer/group norm accepts a bf16 input with fp32 parameters but not the
reverse, which happens where an adapter (LyCORIS) or autocast hands an fp32 tensor to a frozen
bf16 norm, e.g. ``clip_skip = 2`` with a trained text encoder.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from trainer.config.sections.resolution import as_text, base_size
from trainer.system import cpu_bf16, threads

log = logging.getLogger(__name__)

NORMS = (torch.nn.LayerNorm, torch.nn.GroupNorm)


PROBE_SIDE = 64  # pixels of the blank image that tells the latents' shape (a multiple of 16)


def keep_norms_fp32(module: torch.nn.Module) -> int:
    """Cast the parameters of every LayerNorm / GroupNorm in ``module`` back to fp32 (they are
    tiny); returns how many norms were cast."""
    count = 0
    for sub in module.modules():
        if isinstance(sub, NORMS) and any(p.dtype != torch.float32 for p in sub.parameters()):
            sub.float()
            count += 1
    return count


def choose_cpu_precision(s: Any, out: Any) -> None:
    """``training.mixed_precision = "auto"`` on the CPU: bf16 base weights when this CPU has
    bf16 units and the probe (or its cached result) finds them faster for this model and
    resolution, else fp32. Sets ``s.precision`` / ``s.dtype``; other cases are left alone."""
    if s.cfg.training.mixed_precision != "auto" or s.device_info.backend != "cpu":
        return
    units = cpu_bf16.bf16_units()
    if not units:
        out.log("Precision auto: fp32 (this CPU has no bf16 units: no amx_bf16 / avx512_bf16)")
        return
    key = _key(s)
    ratio, how = cpu_bf16.cached_ratio(key), "cached"
    if ratio is None:
        before = threads.read_cpu_times()
        measured = probe(s.model, s.cfg)
        if measured is None:
            out.log("Precision auto: fp32 (the bf16 probe could not copy this model)")
            return
        others = _others_cores(before, threads.read_cpu_times())
        if others is not None and others >= threads.BUSY:
            # another process took CPU from the probe: its ratio is for this run only
            ratio = measured[1] / measured[0]
            how = f"measured with other processes using {others:.1f} cores, not kept"
        else:
            ratio, how = cpu_bf16.store_result(key, *measured), "measured"
    words = cpu_bf16.ratio_words(ratio)
    if ratio < cpu_bf16.FASTER_BELOW:
        s.precision, s.dtype = "bf16", torch.bfloat16
        out.log(f"Precision auto: bf16 base weights ({', '.join(units)}; {how}: {words} than "
                f"fp32 for this model at {as_text(s.cfg.dataset.resolution)} px); trained "
                f"weights stay fp32")
    else:
        out.log(f"Precision auto: fp32 ({', '.join(units)}, but {how}: {words} than fp32 for "
                f"this model at {as_text(s.cfg.dataset.resolution)} px; mixed_precision = 'bf16' "
                f"forces it)")


def _others_cores(before: Any, after: Any) -> float | None:
    """Cores that other processes used during the probe; None where /proc cannot tell."""
    if before is None or after is None:
        return None
    return threads.others_cores(before, after, os.cpu_count() or 1)


def _key(s: Any) -> str:
    unet = s.model.denoiser
    shape = f"{type(unet).__name__} {sum(p.numel() for p in unet.parameters()) / 1e6:.1f}M"
    return cpu_bf16.probe_key(s.device_info.name, torch.__version__, shape,
                              as_text(s.cfg.dataset.resolution), torch.get_num_threads())


def probe(model: Any, cfg: Any) -> tuple[float, float] | None:
    """Seconds of one denoiser forward + backward (gradient to the input, as a LoRA step needs
    through the frozen weights) at batch 1 and the run's resolution: fp32 as loaded and a bf16
    copy under autocast, each the best of two taken in turns. None when no copy can be made."""
    copy = bf16_copy(model.denoiser)
    if copy is None:
        return None
    from trainer.families import family_of

    inputs, family = _inputs(model, cfg), family_of(model)  # FLUX.1: cfg's guidance
    fp32, bf16 = cpu_bf16.seconds_alternated(
        lambda: _step(family, model, model.denoiser, cfg, inputs, False),
        lambda: _step(family, model, copy, cfg, inputs, True))
    log.info("bf16 probe: fp32 %.3fs, bf16 %.3fs", fp32, bf16)
    return fp32, bf16


def bf16_copy(module: torch.nn.Module) -> torch.nn.Module | None:
    """A bf16 copy built on the meta device and filled tensor by tensor, so it costs half the
    fp32 model, never a whole second fp32 copy."""
    from accelerate import init_empty_weights

    try:
        with init_empty_weights(include_buffers=False):  # buffers and tensors built in
            # __init__ (Chroma's unsaved mod_proj, Qwen-Image's RoPE tables) stay real
            copy = type(module).from_config(module.config)
        state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                 for k, v in module.state_dict().items()}
        copy.load_state_dict(state, assign=True)
    except Exception:  # noqa: BLE001 - a model that cannot be rebuilt is not probed
        log.debug("no bf16 copy for the probe", exc_info=True)
        return None
    if any(t.is_meta for t in list(copy.parameters()) + list(copy.buffers())):
        return None
    keep_norms_fp32(copy)
    return copy.requires_grad_(False).eval()


def _inputs(model: Any, cfg: Any) -> tuple[Any, ...]:
    from trainer.families import family_of, spec
    from trainer.run.step import encode_captions

    width, height = base_size(cfg.dataset.resolution)
    noisy = torch.randn(*latent_shape(model, family_of(model), height, width),
                        generator=torch.Generator().manual_seed(0))

    flow = spec(model.version).objective == "flow"  # sigmas, not integer timesteps
    t = torch.tensor([0.5]) if flow else torch.tensor([500])
    # an edit model that trains on pairs only (Qwen-Image-Edit) is probed with one blank
    # control at the target's size, read by its text encoder and its transformer
    ask = getattr(family_of(model), "control_problems", None)
    pairs = bool(ask and ask(model, [0]))
    extra = {"controls": [torch.zeros(1, 3, height, width)]} if pairs else {}
    with torch.no_grad():
        text = encode_captions(model, [""], cfg.model.clip_skip, **extra)
    size_ids = torch.tensor([[height, width, 0, 0, height, width]], dtype=torch.float32)
    return noisy, t, text, size_ids, [torch.zeros_like(noisy)] if pairs else None


def latent_shape(model: Any, family: Any, height: int, width: int,
                 side: int = PROBE_SIDE) -> tuple[int, ...]:
    """The shape of one image's latents at ``height`` x ``width`` as the run's encode path makes
    them (the family's own ``encode_latents`` where it has one: Qwen-Image's normalized 16
    channels, FLUX.2's 2 x 2 patches of 32): a ``side``-pixel blank image is encoded, which is
    cheap at any model size, and its spatial sides are scaled up."""
    from trainer.run.step import encode_images

    with torch.no_grad():
        small = encode_images(model.vae, torch.zeros(1, 3, side, side), family)
    down = side // small.shape[-1]
    return (*small.shape[:-2], height // down, width // down)


def _step(family: Any, model: Any, denoiser: Any, cfg: Any, inputs: tuple[Any, ...],
          bf16: bool) -> None:
    noisy, t, text, size_ids, controls = inputs
    x = noisy.clone().requires_grad_(True)
    extra = {"controls": controls} if controls else {}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        pred = family.predict(model, x, t, text, size_ids, cfg, denoiser=denoiser, **extra)
    torch.autograd.grad(pred.float().square().mean(), x)


def cpu_bf16_norms(backend: str, dtype: torch.dtype, modules: list[Any]) -> None:
    """On the CPU with bf16 base weights, the frozen norms of ``modules`` stay fp32 (see
    :func:`keep_norms_fp32`); GPUs' autocast runs norms in fp32 by itself."""
    if backend == "cpu" and dtype == torch.bfloat16:
        for module in modules:
            keep_norms_fp32(module)
