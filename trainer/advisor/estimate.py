"""Before a run: the step arithmetic, the peak memory on this device, the time, and advice.

``advise(cfg, info)`` reads the dataset as the run will (``trainer.data.prepare_dataset`` and
``trainer.config.plan.plan_steps``), measures one step of the model on the meta device
(:mod:`trainer.advisor.footprint`: no weight is loaded; the step's law answers any bucket,
batch and rank, shipped made for the families' models) and adds up what the run keeps in
memory at its peak, phase by phase:

- loading (the CPU only: the weights in fp32 plus what is read beside them),
- caching the latents (on a GPU before the rest of the model is on the device, in batches of
  half the memory then free, as the trainer sizes them; on the CPU one image at a time, between
  the first epoch's steps),
- a training step: the frozen weights at the compute precision (a GPU's text encoders not, once
  their outputs are cached: the run moves them off the device), the trained ones in fp32 (bf16
  with ``full_bf16``), the VAE in fp32 where it stays on the device (no latent cache, or sample
  images), their gradients, the optimizer's state, autocast's low-precision copies of the
  trained weights, and the step's activations for the batch at the largest bucket (or a live
  VAE encode, whichever is larger),
- the optimizer step (foreach optimizers on a GPU keep a temporary the size of the weights),

plus the runtime itself (the CPU: Python and the libraries; a GPU: the driver's context, which
PyTorch does not count). The time per step is the step's operation count over the device's
throughput plus a pass of the optimizer over the trained weights (:mod:`trainer.advisor.rules`
has the devices and the rules). ``python -m trainer advise CONFIG.toml`` prints the report
(:mod:`trainer.advisor.report`, which also holds the command).
"""

from __future__ import annotations

from typing import Any, Optional

from trainer.advisor.advice import (  # noqa: F401
    CPU_HEAP,
    FITS_BELOW,
    GIB,
    RUNTIME,
    RUNTIME_LOADING,
    Advice,
    Memory,
    Steps,
    Timing,
    gib,
)
from trainer.advisor.dataset_cache import prepared
from trainer.advisor.host_memory import sd_phases
from trainer.advisor.law_keys import with_changes  # noqa: F401 - the advice's changes
from trainer.advisor.rules import Recommendation, device_rules, memory_rules, throughput
from trainer.system.library_lock import library_imports

# What a step costs beside its arithmetic: each dispatched operation (Python and a kernel
# launch), the optimizer's pass over each trained parameter (memory bound: a CPU thread streams a
# few GB/s, a GPU several TB/s) and, without foreach kernels (the CPU), about a dozen
# operations per trained tensor (the update and the gradient clipping).
OP_S = {"cpu": 2e-5, "gpu": 1e-5}
OPTIMIZER_S_PER_PARAM = {"cpu": 2e-8, "gpu": 5e-11}
OPS_PER_TENSOR = {"cpu": 12, "gpu": 0}


# --- the step arithmetic -----------------------------------------------------------------

def step_arithmetic(cfg: Any) -> Steps:
    from trainer.config.plan import plan_steps
    from trainer.config.sections.resolution import base_size
    from trainer.data import DatasetError

    tr, base = cfg.training, base_size(cfg.dataset.resolution)
    try:
        data = prepared(cfg)
        plan = plan_steps(data.steps_per_epoch(tr.train_batch_size),
                          tr.gradient_accumulation_steps, tr.max_train_steps,
                          tr.max_train_epochs)
    except (DatasetError, ValueError) as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        return Steps(largest_bucket=base, problem="; ".join(problems))
    sizes = [tuple(int(x) for x in name.split("x")) for name in data.bucket_table()]
    largest = max(sizes, key=lambda s: s[0] * s[1], default=base)
    return Steps(data.num_images, len(data.held_out), data.num_repeated,
                 plan.batches_per_epoch, plan.steps_per_epoch, plan.epochs, plan.total_steps,
                 largest)


# --- memory ------------------------------------------------------------------------------

def optimizer_state_bytes(name: str, step: Any, trained_bytes: int) -> float:
    """Bytes of the optimizer's state for the step's trained parameters, kept in their dtype
    (``trained_bytes`` each): AdamW two moments, Lion one, the 8-bit ones in a byte each,
    Prodigy four tensors (two moments, s and the initial weights), Adafactor its factored
    second moment; the others as trainer.optim.optimizers.OPTIMIZERS counts them."""
    from trainer.optim.optimizers import state_bytes_per_weight

    per_weight = state_bytes_per_weight(name, trained_bytes)
    if per_weight is None:  # Adafactor
        return step.factored * trained_bytes
    return step.trained * per_weight


def _precision(cfg: Any, info: Any) -> str:
    from trainer.system.device import PrecisionError, resolve_precision

    try:
        return resolve_precision(cfg.training.mixed_precision, info)
    except PrecisionError:
        return resolve_precision("auto", info)


def _dtype(precision: str) -> Any:
    import torch

    return {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def _step(cfg: Any, info: Any, configs: Any, bucket: tuple[int, int], gc: bool,
          measured_at: Optional[tuple[tuple[int, int], int]]) -> tuple[Any, float]:
    """(the step's footprint, a factor for its activations and work) at ``bucket`` and the
    batch, from the step's law (:func:`trainer.advisor.footprint.simulate_step`). For the
    variants the advice tries (``measured_at``: the config's own bucket and batch), a law
    of the batch measured answers another batch rather than two more simulations; without a
    law, the step at ``measured_at`` is scaled by the pixels (what a fused attention's memory
    and a UNet's work grow with)."""
    from trainer.advisor.footprint import law_footprint, simulate_step, step_law

    batch, dtype = cfg.training.train_batch_size, _dtype(_precision(cfg, info))
    if measured_at is None:
        return simulate_step(configs, cfg, bucket, batch, dtype, gc), 1.0
    at_bucket, at_batch = measured_at
    for law_batch, simulate in ((batch, False), (at_batch, True)):
        law = step_law(configs, cfg, dtype, gc, law_batch, simulate)
        if law is not None and (batch == 1 or law_batch > 1):
            return law_footprint(law, configs, cfg, bucket, batch, dtype), 1.0
    step = simulate_step(configs, cfg, at_bucket, at_batch, dtype, gc, full=True)
    scale = (batch * bucket[0] * bucket[1]) / (at_batch * at_bucket[0] * at_bucket[1])
    return step, scale


def cache_rows(configs: Any, bucket: tuple[int, int], capacity: Optional[int],
               held: float) -> int:
    """The images per VAE encode call of a GPU's latent cache at ``bucket``, as
    trainer/data/cache_batches.py sizes them: half of what is free beside ``held`` bytes."""
    from trainer.data.cache_batches import FALLBACK_BUDGET, latent_batches

    budget = int(max(capacity - held, 0) // 2) if capacity else FALLBACK_BUDGET
    return latent_batches(configs.vae, budget)(bucket)


def frozen_lines(cfg: Any, configs: Any, frozen: int, unet: int, c: int, name: str,
                 text_on_device: bool = True) -> list[tuple[str, float]]:
    """The frozen weights' lines: ``frozen`` parameters, ``unet`` of them the UNet's (0 for
    DreamBooth), the rest the text encoders' (left out where they are off the device); the
    UNet apart where a memory option changes its bytes (:mod:`trainer.advisor.base_weights`)."""
    base, swap, text = cfg.model.base_precision, cfg.training.blocks_to_swap, frozen - unet
    if (base == "full" and swap is None) or cfg.mode == "dreambooth":
        if text_on_device or not text:
            return [(f"frozen weights: {frozen / 1e6:.1f} M x {name}", frozen * c)]
        return [(f"frozen UNet: {unet / 1e6:.1f} M x {name}", unet * c)] if unet else []
    from trainer.advisor.base_weights import device_bytes, unet_weights

    w = unet_weights(configs)
    how = (name if base == "full" else f"{base} base") + (
        f", {swap} blocks swapped" if swap else "")
    lines: list[tuple[str, float]] = [
        (f"frozen UNet: {w.total / 1e6:.1f} M ({how})", device_bytes(w, base, swap, c))]
    if text_on_device and text:
        lines.append((f"frozen text encoders: {text / 1e6:.1f} M x {name}", text * c))
    return lines


def text_encoders_leave(cfg: Any, info: Any) -> bool:
    """Whether a GPU run moves its frozen text encoders off the device once their outputs are
    cached (trainer/run/caches.py), before the first step."""
    from trainer.data.text_cache import text_cache_allowed

    return (info.backend != "cpu" and cfg.dataset.cache_text_encoder_outputs is not False
            and text_cache_allowed(cfg)[0])


def copies_lines(cfg: Any, configs: Any, c: int, name: str,
                 gc: bool) -> list[tuple[str, float]]:
    """A step's compute copies of the fp8-stored layers (none outside a step)."""
    if cfg.model.base_precision != "fp8" or cfg.mode == "dreambooth":
        return []
    from trainer.advisor.base_weights import compute_copies, unet_weights

    return [(f"{name} copies of the fp8 layers kept for the backward pass ("
             + ("one block: gradient checkpointing" if gc else "all of them: no gradient "
                "checkpointing") + ")", compute_copies(unet_weights(configs), "fp8", c, gc))]


def memory_estimate(cfg: Any, info: Any, configs: Any, bucket: tuple[int, int],
                    checkpointing: Optional[bool] = None,
                    measured_at: Optional[tuple[tuple[int, int], int]] = None) -> Memory:
    """The peak phase and its parts for ``cfg`` on ``info`` (see the module's docstring)."""
    phases = memory_phases(cfg, info, configs, bucket, checkpointing, measured_at)
    return max(phases, key=lambda m: m.peak)


def memory_phases(cfg: Any, info: Any, configs: Any, bucket: tuple[int, int],
                  checkpointing: Optional[bool] = None,
                  measured_at: Optional[tuple[tuple[int, int], int]] = None) -> list[Memory]:
    """Each phase with its parts on the device (on the CPU: in RAM)."""
    from trainer.advisor.footprint import param_counts, simulate_encode

    tr, ds, precision = cfg.training, cfg.dataset, _precision(cfg, info)
    gc = tr.gradient_checkpointing if checkpointing is None else checkpointing
    dtype = _dtype(precision)
    step, scale = _step(cfg, info, configs, bucket, gc, measured_at)
    params, cpu = param_counts(configs), info.backend == "cpu"
    c, t = dtype.itemsize, 2 if tr.full_bf16 else 4
    name = "fp32" if c == 4 else precision
    unet = params["unet"] if cfg.mode != "dreambooth" else 0
    others = [(f"trained weights: {step.trained / 1e6:.2f} M x {'bf16' if t == 2 else 'fp32'}",
               step.trained * t)]
    vae = (f"VAE: {params['vae'] / 1e6:.1f} M x fp32", params["vae"] * 4)
    if cpu or not ds.cache_latents or cfg.sampling.sample_prompts:
        others.append(vae)
    weights = frozen_lines(cfg, configs, step.frozen, unet, c, name) + others
    stepping = weights  # a GPU's steps, the text encoders off the device once cached
    if step.frozen > unet and text_encoders_leave(cfg, info):
        stepping = frozen_lines(cfg, configs, step.frozen, unet, c, name, False) + others
    runtime = [("runtime: " + ("Python and the libraries" if cpu else "driver context"),
                RUNTIME.get(info.backend, RUNTIME["cuda"]))]
    state = [(f"optimizer state ({cfg.optimizer.optimizer_type})",
              int(optimizer_state_bytes(cfg.optimizer.optimizer_type, step, t))),
             ("gradients", step.trained * t)]
    if precision != "no" and t == 4:
        state.append((f"autocast copies of the trained weights ({precision})", step.trained * c))
    batch = tr.train_batch_size
    acts = (f"activations: batch {batch} at {bucket[0]}x{bucket[1]}, gradient checkpointing "
            f"{'on' if gc else 'off'}", step.step_bytes * scale)
    if not ds.cache_latents:
        encode = simulate_encode(configs, bucket, batch)
        acts = max(acts, (f"live VAE encode: batch {batch}", encode), key=lambda x: x[1])
    heap = [("the C heap's spare blocks (CPU)", int(CPU_HEAP * acts[1]))] if cpu else []
    copies = copies_lines(cfg, configs, c, name, gc)
    phases = [("training step", runtime + stepping + state + copies + [acts] + heap)]
    if not cpu and cfg.optimizer.optimizer_type in ("AdamW", "Lion", "Prodigy"):
        phases.append(("optimizer step", runtime + stepping + state
                       + [("optimizer temporaries", step.trained * 4)]))
    if ds.cache_latents:
        # the CPU encodes each image (and its mirror) between the first epoch's steps
        # (trainer/run/caches.py), the optimizer state beside it; a GPU before the first step,
        # the VAE alone on the device, in batches of half the memory then free
        # (trainer/data/cache_batches.py)
        held = runtime + weights + state if cpu else runtime + [vae]
        rows = (2 if ds.flip_aug else 1) if cpu else cache_rows(
            configs, bucket, info.memory_bytes, sum(b for _, b in held))
        phases.append(("caching latents", held + [
            (f"VAE encode: batch {rows}", simulate_encode(configs, bucket, rows))]))
    if cpu:
        total = sum(params.values())
        phases.append(("loading the model", [
            ("runtime: Python and the libraries a load imports", RUNTIME_LOADING),
            (f"all weights as loaded: {total / 1e6:.1f} M x fp32", total * 4),
            ("read from the files beside them", configs.load_extra_bytes)]))
    return [Memory(phase, tuple((what, int(b)) for what, b in lines), info.memory_bytes, gc)
            for phase, lines in phases]


def timing(cfg: Any, info: Any, configs: Any, steps: Steps,
           checkpointing: Optional[bool] = None) -> Timing:
    tr, precision = cfg.training, _precision(cfg, info)
    gc = tr.gradient_checkpointing if checkpointing is None else checkpointing
    step, _ = _step(cfg, info, configs, steps.largest_bucket, gc, None)
    rate, basis = throughput(info, precision)
    batches = tr.gradient_accumulation_steps
    flop = step.flops * batches
    kind = "cpu" if info.backend == "cpu" else "gpu"
    overhead = (OP_S[kind] * (step.ops * batches + OPS_PER_TENSOR[kind] * step.tensors)
                + OPTIMIZER_S_PER_PARAM[kind] * step.trained)
    per_step = flop / (rate * 1e12) + overhead
    total = per_step * steps.total_steps if steps.total_steps else None
    return Timing(per_step, total, flop / 1e12, basis)


# --- advice ------------------------------------------------------------------------------

def _bucket_for(cfg: Any, base: Any, bucket: tuple[int, int]) -> tuple[int, int]:
    """The largest bucket after a resolution change (scaled, on multiples of 8)."""
    from trainer.config.sections.resolution import area_side

    ratio = area_side(cfg.dataset.resolution) / area_side(base.dataset.resolution)
    return tuple(max(8, int(side * ratio) // 8 * 8) for side in bucket)  # type: ignore


def _recommendations(cfg: Any, info: Any, configs: Any, steps: Steps, memory: Memory,
                     other: Memory) -> list[Recommendation]:
    precision = _precision(cfg, info)
    out = [r for r in device_rules(cfg, info, precision)]
    if not memory.fits and memory.capacity:
        measured_at = (steps.largest_bucket, cfg.training.train_batch_size)

        def peak_of(changes: dict[str, Any]) -> int:
            changed = with_changes(cfg, changes)
            bucket = _bucket_for(changed, cfg, steps.largest_bucket)
            return memory_estimate(changed, info, configs, bucket,
                                   measured_at=measured_at).peak
        out = memory_rules(cfg, info, precision, peak_of,
                           int(memory.capacity * FITS_BELOW)) + out
    elif (cfg.training.gradient_checkpointing and other.fits and info.backend != "cpu"
          and other.capacity and other.peak < other.capacity * 0.8):
        out.append(Recommendation("Turn off gradient checkpointing", "it fits without it, "
                                  "and steps are faster", {"training.gradient_checkpointing":
                                                           False}))
    return out


def advise(cfg: Any, info: Any = None) -> Advice:
    """Everything the advisor says about ``cfg`` on ``info`` (default: this machine's device).
    Problems (a dataset that cannot be read, a model that cannot be found) come back in
    ``problems``; they are not raised."""
    from trainer.system.device import detect

    info = info or detect()
    # one estimate at a time (each page's tabs ask at once), and not while a run in the same
    # process imports the same classes (trainer/system/library_lock.py)
    with library_imports():
        return _advise(cfg, info)


def _advise(cfg: Any, info: Any) -> Advice:
    from trainer.advisor.footprint import read_configs

    advice = Advice(info.summary(), _precision(cfg, info), step_arithmetic(cfg))
    if advice.steps.problem:
        advice.problems.append(f"dataset: {advice.steps.problem} (the estimate assumes "
                               f"{advice.steps.largest_bucket[0]} px squares)")
    try:
        if _flow_advice(advice, cfg, info):  # FLUX.1 / SD 3.5 (trainer/advisor/flow_advice.py)
            return advice
        configs = read_configs(cfg.model)
        bucket = advice.steps.largest_bucket
        gc = cfg.training.gradient_checkpointing
        phases = memory_phases(cfg, info, configs, bucket)
        advice.memory = max(phases, key=lambda m: m.peak)
        advice.phases, advice.ram = sd_phases(cfg, info, configs, phases,
                                              text_encoders_leave(cfg, info))
        advice.other = memory_estimate(cfg, info, configs, bucket, checkpointing=not gc)
        advice.timing = timing(cfg, info, configs, advice.steps)
        advice.other_timing = timing(cfg, info, configs, advice.steps, checkpointing=not gc)
        advice.recommendations = _recommendations(cfg, info, configs, advice.steps,
                                                  advice.memory, advice.other)
    except ValueError as exc:  # ModelLoadError, nothing to train, a bad combination
        advice.problems.append(str(exc))
    return advice


def _flow_advice(advice: Advice, cfg: Any, info: Any) -> bool:
    from trainer.advisor.flow_advice import flow_advise, flow_transformer_config

    config = flow_transformer_config(cfg.model)
    if config is None:
        return False
    flow_advise(advice, cfg, info, config)
    return True
