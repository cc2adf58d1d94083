"""``training.full_fp16``: sd-scripts' ``--full_fp16``. The trained weights (and so their
gradients and the optimizer's state) are fp16, not fp32; accelerate's loss scaler
(torch.amp.GradScaler, there with mixed_precision = 'fp16') refuses to unscale fp16 gradients,
so, as sd-scripts' ``train_util.patch_accelerator_for_fp16_training`` does, its
``_unscale_grads_`` is called with ``allow_fp16=True``. The scaler still skips a step whose
gradients overflowed and lowers its scale.

GPUs only: the scaler and fp16 compute are what CUDA / ROCm give; on the CPU (and MPS / XPU) the
run is refused before the model loads, with the reason."""

from __future__ import annotations

from typing import Any

import torch

GPU_BACKENDS = ("cuda", "rocm")


def check(full_fp16: bool, precision: str, backend: str) -> None:
    """Refuse what cannot run: full_fp16 off a GPU, or under a precision other than fp16."""
    from trainer.system.device import PrecisionError

    if not full_fp16:
        return
    if backend not in GPU_BACKENDS:
        raise PrecisionError(
            f"training.full_fp16 needs a CUDA or ROCm GPU, but this run is on {backend!r}: fp16 "
            f"weights train only with the loss scaler of GPU fp16 mixed precision (sd-scripts "
            f"requires the same); turn full_fp16 off (training.full_bf16 keeps bf16 weights "
            f"where the device does bf16)")
    if precision != "fp16":
        raise PrecisionError(f"training.full_fp16 needs mixed_precision = 'fp16', but the "
                             f"precision is {precision!r}")


def trained_dtype(training: Any) -> torch.dtype:
    """The dtype of the trained weights: fp16 / bf16 with full_fp16 / full_bf16, else fp32."""
    if getattr(training, "full_fp16", False):
        return torch.float16
    return torch.bfloat16 if training.full_bf16 else torch.float32


def patch_scaler(accelerator: Any) -> bool:
    """Let the accelerator's GradScaler unscale fp16 gradients (sd-scripts' patch); False when
    there is no scaler (a precision other than fp16)."""
    scaler = getattr(accelerator, "scaler", None)
    if scaler is None:
        return False
    unscale = scaler._unscale_grads_

    def _unscale_grads_(optimizer: Any, inv_scale: Any, found_inf: Any, allow_fp16: bool):
        return unscale(optimizer, inv_scale, found_inf, True)

    scaler._unscale_grads_ = _unscale_grads_
    return True
