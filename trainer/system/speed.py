"""Speed settings that depend on the device: torch.compile's prerequisites, fused optimizers."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any, Optional


class CompileUnavailable(ValueError):
    """training.compile cannot work here; the message says what to install or turn off."""


def compile_problem(backend: str) -> Optional[str]:
    """Why torch.compile's default backend (inductor) cannot compile here; None if it can.

    On the CPU inductor writes C++ and needs a compiler; on GPUs it writes Triton kernels.
    """
    if os.environ.get(ENV_BACKEND) in ("eager", "aot_eager"):
        return None  # nothing is compiled to code
    if backend == "cpu":
        compilers = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
        if not any(c and shutil.which(c) for c in compilers):
            return ("the CPU backend of torch.compile needs a C++ compiler and none was found "
                    "(install g++, e.g. apt-get install g++, or set CXX), or turn it off")
        return None
    if backend in ("cuda", "rocm", "xpu") and importlib.util.find_spec("triton") is None:
        return ("torch.compile on this GPU needs Triton, which this torch build lacks "
                "(reinstall torch with setup.sh), or turn it off")
    if backend == "mps":
        return "torch.compile does not train on Apple's MPS backend yet; turn it off"
    return None


# What the loader says of a compiled kernel that an interrupted compile left empty or cut short
# (not "no such file": inductor says that of a missing compiler or header too).
_BROKEN_KERNEL = ("file too short", "invalid ELF header")


def broken_compile_cache(exc: BaseException) -> Optional[CompileUnavailable]:
    """A clear error when torch.compile failed on a kernel file in its cache that a killed
    compile left broken (inductor then reads the empty ``.so`` on every later run); else None."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    if not any(type(e).__module__.startswith("torch._inductor") for e in chain):
        return None
    text = " ".join(str(e) for e in chain)
    if not any(sign in text for sign in _BROKEN_KERNEL):
        return None
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = cache_dir()
    return CompileUnavailable(
        f"training.compile: a compiled kernel in torch.compile's cache ({folder}) is broken, "
        f"most likely left by a compile that was stopped or killed. Delete that folder "
        f"(rm -rf {folder}) and start again, or set training.compile = false. "
        f"({text.strip()[:300]})")


# torch.compile's backend: inductor unless KOHYA_STUDIO_COMPILE_BACKEND names another, such as
# "eager" or "aot_eager", which check the graph capture without generating code (tests, bugs).
ENV_BACKEND = "KOHYA_STUDIO_COMPILE_BACKEND"


def compile_options() -> dict[str, Any]:
    backend = os.environ.get(ENV_BACKEND)
    return {"backend": backend} if backend else {}


def fused_adamw_kwargs(params: list[Any], args: dict[str, Any]) -> dict[str, Any]:
    """``{"fused": True}`` where torch has a fused AdamW kernel for the parameters' device.

    The fused kernel updates every tensor in one call, instead of a handful of small ops per
    tensor, which is most of the optimizer's time for a LoRA's hundreds of small tensors.
    ``optimizer.optimizer_args`` that choose ``fused``, ``foreach`` or ``capturable`` win.
    """
    if any(k in args for k in ("fused", "foreach", "capturable", "differentiable")):
        return {}
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = {p.device.type for p in params}
    if len(devices) != 1 or not devices <= set(_get_fused_kernels_supported_devices()):
        return {}
    if not all(p.is_floating_point() for p in params):
        return {}
    return {"fused": True}
