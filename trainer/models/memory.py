"""Base weights in less memory: fp8 storage, bitsandbytes NF4 / int8, block swap.

The run calls this module twice around the method's ``prepare`` (trainer/run/session.py):

- :meth:`MemoryPlan.begin`, before anything moves to the device: refuses what the backend
  cannot run (naming the option and the backend), casts the modules it places itself to the
  compute dtype on the host and, for ``nf4`` / ``int8``, replaces the denoiser's frozen Linear
  layers by bitsandbytes' (trainer/models/quantize.py; before the adapters are injected),
  where the loader has not quantized them as they arrived already (a single file);
- :meth:`MemoryPlan.finish`, after the adapters exist: stores the frozen weights in fp8
  (``model.base_precision = "fp8"``, ``model.fp8_text_encoders``), then moves what it placed to
  the device, but for the blocks that ``training.blocks_to_swap`` keeps in host memory
  (:mod:`trainer.models.block_swap`).

Why fp8 storage is our own small hook and not diffusers' layerwise casting
(``apply_layerwise_casting``): that hook casts a layer's parameters to the compute dtype in
place before its forward and back to fp8 after it, so a tensor that autograd saved for the
backward pass *is* the parameter, which is fp8 again by then. A convolution saves its weight
that way on every backend, so its backward met an fp8 weight wherever autocast had not made a
copy first (fp32 compute; bf16 autocast on a CPU without bf16 units, or on any GPU whose conv
takes the already-bf16 weight as it is). Here the stored parameters never change: each forward
computes from a fresh compute-dtype copy (:class:`ComputeCopies`), which is what autograd
saves, on every kernel. torchao is not used: it is not installed, and its float8 training
needs fp8 matmul units (Ada/Hopper GPUs). Peft's adapter layers, the model's fp32 modules and
the embedders keep their dtype (:data:`SKIP_PATTERNS`). At most one layer is held at full
precision at a time, plus what autograd saves for the backward pass; with gradient
checkpointing that is one block's worth.

A checkpoint shipped in fp8 loads exactly: every float8_e4m3fn value is a bf16 (and fp32)
value, so the loader's upcast and this module's cast back are lossless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch

from trainer.models import quantize
from trainer.models.quantize import load_bitsandbytes

FP8 = torch.float8_e4m3fn
# Layers kept at the compute precision: the embedders of the latents, the time and the text,
# the first and last projections (a few MB, precision-critical). Norm layers are never cast
# (layerwise casting only touches Linear, Conv and Embedding). The norm-modulation Linears
# (AdaLayerNorm's ``norm1.linear``: 3.2 G of FLUX.1's 11.9 G parameters), which diffusers'
# own list would keep, are stored in fp8 as sd-scripts' --fp8_base stores them: kept in bf16
# they would cost FLUX.1 6 GB more and miss the 16 GB cards.
SKIP_PATTERNS = ("pos_embed", "patch_embed", "embed", "^proj_in$", "^proj_out$",
                 "^conv_in$", "^conv_out$")
T5_SKIP = ("norm", "shared", "embed", "relative_attention_bias")
QUANTIZED = ("nf4", "int8")


class MemoryOptionUnavailable(RuntimeError):
    """A memory option that the detected backend cannot run (refused before loading)."""


def _peft_patterns() -> tuple[str, ...]:
    from peft.tuners.lora.layer import LoraLayer

    return tuple(LoraLayer.adapter_layer_names)


def backend_problem(cfg: Any, backend: str, label: str) -> Optional[str]:
    """Why a memory option of ``cfg`` cannot run on ``backend`` (None when all can)."""
    base, swap = cfg.model.base_precision, cfg.training.blocks_to_swap
    if (base == "fp8" or cfg.model.fp8_text_encoders) and backend == "mps":
        name = "model.base_precision = 'fp8'" if base == "fp8" else "model.fp8_text_encoders"
        return f"{name}: the {label} backend has no float8 tensors; set it off"
    if base in QUANTIZED:
        problem = bitsandbytes_problem(backend)
        if problem:
            return f"model.base_precision = {base!r} on the {label} backend: {problem}"
    if swap is not None and backend == "cpu":
        return (f"training.blocks_to_swap = {swap} on the {label} backend: the blocks already "
                f"live in host memory; unset it")
    return None


def check_memory_options(cfg: Any, backend: str, label: str) -> None:
    """Raise :class:`MemoryOptionUnavailable` naming the option and the backend."""
    problem = backend_problem(cfg, backend, label)
    if problem:
        raise MemoryOptionUnavailable(problem)


def bitsandbytes_problem(backend: str) -> Optional[str]:
    """Whether the installed bitsandbytes quantizes on ``backend`` (None when it does)."""
    if backend not in ("cuda", "rocm", "cpu", "xpu"):
        return ("bitsandbytes has no 4-/8-bit layers for this backend; use "
                "model.base_precision = 'fp8'")
    try:
        bnb = load_bitsandbytes()
        from bitsandbytes.functional import quantize_4bit
    except Exception as exc:  # noqa: BLE001 - a broken install says why here, not at step 1
        return f"bitsandbytes cannot be imported ({exc}); use model.base_precision = 'fp8'"
    try:  # one tiny quantization proves the backend's kernels are there
        quantize_4bit(torch.ones(64, 64, device=_probe_device(backend)), quant_type="nf4")
        del bnb
    except Exception as exc:  # noqa: BLE001
        return (f"the installed bitsandbytes cannot quantize here ({exc}); use "
                f"model.base_precision = 'fp8'")
    return None


def _probe_device(backend: str) -> str:
    return {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu"}.get(backend, "cpu")


_skipped = quantize.skipped


# The layer types whose weights fp8 storage holds (diffusers' layerwise casting's list).
CAST_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
               torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d,
               torch.nn.Embedding)


class ComputeCopies:
    """Forward hooks that let a layer whose parameters are stored in fp8 compute from copies
    in ``dtype``: the copies stand in the layer's parameter slots for the length of one forward
    (so autograd saves them, never the fp8 parameter) and the stored parameters go back after
    it, also when the forward raises."""

    def __init__(self, dtype: torch.dtype, layer: torch.nn.Module):
        self.dtype, self.layer = dtype, layer
        self.stored: dict[str, torch.nn.Parameter] = {}

    def before(self, module: torch.nn.Module, args: Any) -> None:
        params = self.layer._parameters
        self.stored = {n: p for n, p in params.items() if p is not None and p.dtype == FP8}
        for name, param in self.stored.items():
            params[name] = param.to(self.dtype)  # type: ignore[assignment]

    def after(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.layer._parameters.update(self.stored)
        self.stored = {}


def fp8_layers(module: torch.nn.Module, skip: tuple[str, ...] = SKIP_PATTERNS
               ) -> list[tuple[str, torch.nn.Module]]:
    """The layers of ``module`` that fp8 storage holds: its Linear, Conv and Embedding layers
    outside the skipped patterns and peft's adapters. Those of the model's own fp32 list (T5's
    ``wo``) are held too, and compute in fp32 (:func:`store_fp8`)."""
    patterns = skip + _peft_patterns()
    return [(name, layer) for name, layer in module.named_modules()
            if isinstance(layer, CAST_LAYERS)
            and not any(_skipped(n, patterns) for n in (name, *_ancestors(name)))]


def _fp32_listed(module: torch.nn.Module, name: str) -> bool:
    """Whether layer ``name`` is on the model's own fp32 list (``_keep_in_fp32_modules``)."""
    listed = tuple(getattr(module, "_keep_in_fp32_modules", None) or ())
    return any(_skipped(n, listed) for n in (name, *_ancestors(name)))


def fp8_parameter_names(module: torch.nn.Module, skip: tuple[str, ...] = SKIP_PATTERNS
                        ) -> set[str]:
    """The names of the parameters that fp8 storage holds (those of :func:`fp8_layers`)."""
    return {f"{name}.{param}" for name, layer in fp8_layers(module, skip)
            for param, _ in layer.named_parameters(recurse=False)}


def store_fp8(module: torch.nn.Module, compute_dtype: torch.dtype,
              skip: tuple[str, ...] = SKIP_PATTERNS) -> int:
    """Frozen Linear / Conv weights of ``module`` stored in fp8 and computed from a copy in
    ``compute_dtype`` at each forward (:class:`ComputeCopies`); the skipped patterns, the
    model's own fp32 list, peft's adapters and every layer that trains stay as they are, and
    a layer stored already (by the loader, trainer/families/common/mmdit_single_file.py) now
    computes in ``compute_dtype`` (the run's precision may be chosen after the load). Returns how
    many layers it stores now."""
    count = 0
    for name, layer in fp8_layers(module, skip):
        listed = _fp32_listed(module, name)
        dtype = torch.float32 if listed else compute_dtype
        if getattr(layer, "_fp8_copies", None) is not None:  # stored: compute in this dtype
            layer._fp8_copies.dtype = layer.compute_dtype = dtype
            continue
        if any(p.requires_grad for p in layer.parameters()):
            continue
        layer.to(FP8)
        copies = ComputeCopies(dtype, layer)
        # a listed layer's parent reads its weight's dtype before calling it (T5's
        # DenseReluDense casts its input to wo's): its copy stands in from the parent's forward
        host = module.get_submodule(name.rpartition(".")[0]) if listed else layer
        host.register_forward_pre_hook(copies.before)
        host.register_forward_hook(copies.after, always_call=True)
        layer._fp8_copies = copies
        # peft gives a layer with a compute_dtype (bitsandbytes' convention) adapters in that
        # dtype, not in its weight's: a LoRA on a layer stored at load is made as on bf16
        layer.compute_dtype = compute_dtype
        count += 1
    return count


def fp8_storage(dtype: torch.dtype, skip: tuple[str, ...] = SKIP_PATTERNS) -> Any:
    """For a loader (trainer/models/streamed_load.py's ``Storage``): the weights that fp8
    storage holds arrive in fp8, an fp8 file's tensor as it is, another one cast by way of
    ``dtype`` (the values that storing a ``dtype``-built model in fp8 gives)."""
    from trainer.models.streamed_load import Storage, scratch

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.dtype == FP8 else scratch(tensor, dtype).to(FP8)

    return Storage(lambda model: fp8_parameter_names(model, skip), convert)


def to_compute_dtype(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """``module.to(dtype)``, but for the weights stored in fp8 or quantized already."""
    if not any(p.dtype == FP8 or not p.dtype.is_floating_point for p in module.parameters()):
        module.to(dtype)
        return
    for sub in module.modules():
        for param in sub._parameters.values():
            if param is not None and param.dtype.is_floating_point and param.dtype != FP8:
                param.data = param.data.to(dtype)
        for name, buf in sub._buffers.items():
            if buf is not None and buf.dtype.is_floating_point:
                sub._buffers[name] = buf.to(dtype)


def _ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``: a skipped module skips what it holds."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def quantize_linears(module: torch.nn.Module, kind: str, compute_dtype: torch.dtype,
                     device: torch.device, skip: tuple[str, ...] = SKIP_PATTERNS) -> int:
    """Replace the frozen ``nn.Linear`` layers of ``module`` by bitsandbytes' NF4 / int8 ones,
    quantized on ``device`` (trainer/models/quantize.py); returns how many."""
    return quantize.quantize_linears(module, kind, compute_dtype, device, skip)


class MemoryPlan:
    """What the memory options do to one run's model; see the module's notes."""

    def __init__(self, cfg: Any, model: Any, dtype: torch.dtype, device: torch.device):
        self.cfg, self.model, self.dtype, self.device = cfg, model, dtype, torch.device(device)
        self.base = cfg.model.base_precision
        self.swap = cfg.training.blocks_to_swap
        self.swapper: Any = None
        self.t5 = _t5_of(model) if cfg.model.fp8_text_encoders else None
        self.held: list[torch.nn.Module] = []
        if self.base != "full" or self.swap is not None:
            self.held.append(model.denoiser)
        if self.t5 is not None:
            self.held.append(self.t5)

    def holds(self, module: Any) -> bool:
        """Whether this plan moves ``module`` to the device itself (in :meth:`finish`)."""
        return any(module is held for held in self.held)

    def begin(self, backend: str, label: str, log: Callable[..., None]) -> None:
        """Refuse what ``backend`` cannot run; cast the held modules on the host; quantize.
        ``log(message, level="info")``: the run's log."""
        check_memory_options(self.cfg, backend, label)
        if backend == "cpu" and self.base == "fp8":
            log("model.base_precision = 'fp8' on the CPU: each layer's weights are cast from "
                "fp8 at every step, which the CPU does slowly (an SD 1.5-size UNet at 256 px: "
                "21 s/step against 1.3 in bf16, bench/memory_options.py); 'full' with "
                "training.mixed_precision = 'bf16' halves the memory at full speed", "warning")
        if self.base == "fp8" and not self.cfg.training.gradient_checkpointing:
            log("model.base_precision = 'fp8' without training.gradient_checkpointing: autograd "
                "keeps each layer's compute-precision copy for the backward pass, so a step "
                "holds the weights in both precisions, more than without fp8; turn gradient "
                "checkpointing on", "warning")
        for module in self.held:
            if self.dtype != torch.float32:
                to_compute_dtype(module, self.dtype)
            if any(getattr(m, "_fp8_copies", None) for m in module.modules()):
                # stored by the loader: computed in the run's precision
                store_fp8(module, self.dtype, T5_SKIP if module is self.t5 else SKIP_PATTERNS)
        if self.base in QUANTIZED:
            loaded = quantize.set_compute_dtype(self.model.denoiser, self.dtype)  # by the loader
            count = quantize_linears(self.model.denoiser, self.base, self.dtype, self.device)
            how = " (quantized as the file loaded)" if loaded else ""
            log(f"Base weights: {count + loaded} Linear layers of the denoiser in {self.base} "
                f"(bitsandbytes){how}, the adapters in full precision")

    def finish(self, log: Callable[[str], None]) -> None:
        """After the adapters exist: fp8 storage, then the held modules to the device."""
        if self.base == "fp8":
            store_fp8(self.model.denoiser, self.dtype)
            log("Base weights: the denoiser's frozen Linear and Conv layers stored in fp8, "
                "computed layer by layer in " + str(self.dtype).replace("torch.", ""))
        if self.t5 is not None and not any(p.requires_grad for p in self.t5.parameters()):
            store_fp8(self.t5, self.dtype, T5_SKIP)
            log("T5 text encoder stored in fp8")
        for module in self.held:
            if module is self.model.denoiser and self.swap is not None:
                self._install_swap(log)
            else:
                module.to(self.device)
                quantize.place_state(module, self.device)

    def _install_swap(self, log: Callable[[str], None]) -> None:
        from trainer.models.block_swap import BlockSwapper, swap_units

        units = swap_units(self.model.denoiser)
        swapped = {id(p) for u in units[len(units) - self.swap:] for p in u.parameters()}
        for module in self.model.denoiser.modules():  # everything else goes to the device
            for param in module.parameters(recurse=False):
                if id(param) not in swapped:
                    param.data = param.data.to(self.device)
            for name, buf in list(module._buffers.items()):
                if buf is not None:
                    module._buffers[name] = buf.to(self.device)
        quantize.place_state(self.model.denoiser, self.device, lambda p: id(p) not in swapped)
        self.swapper = BlockSwapper(units, self.swap, self.device)
        log(f"Block swap: {self.swap} of the denoiser's {len(units)} blocks live in host "
            f"memory and visit the device as they run")


def released(module: Any) -> bool:
    """A module let go after use (trainer/run/text_first.py): its tensors on the meta device."""
    params = list(module.parameters()) if module is not None else []
    return bool(params) and all(p.device.type == "meta" for p in params)


def _t5_of(model: Any) -> Optional[torch.nn.Module]:
    for name in ("text_encoder_2", "text_encoder_3"):
        encoder = getattr(model, name, None)
        if encoder is not None and type(encoder).__name__.startswith("T5") and \
                not released(encoder):
            return encoder
    return None
