"""Everything a run needs before its first step, built in order: the set-up half of the loop.

:func:`prepare` detects the device once, resolves the precision, checks the data, loads the base
model, generates missing class images, places the model, lets the method inject or unfreeze what
trains, fills the caches and builds the optimizer. Each stage fills a field of a
:class:`Session`, so a run that fails or stops half-way can still release what was built. The
loop (trainer/run/loop.py) only reads the session.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from trainer.config import TrainConfig
from trainer.config.plan import StepPlan, plan_steps
from trainer.events import Event
from trainer.run import fsdp, full_fp16, fused_steps, text_first
from trainer.run.caches import fill_latent_cache, fill_text_cache
from trainer.run.cpu_precision import choose_cpu_precision, cpu_bf16_norms
from trainer.run.ema import NoEma, make_ema
from trainer.run.state import Progress
from trainer.run.unused import release_decoder
from trainer.system.heap import give_back_free_memory

log = logging.getLogger(__name__)

DTYPES = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Reporter(Protocol):
    """How set-up talks: log lines, events, and a way to honour Stop between stages."""

    def log(self, message: str, level: str = "info") -> None: ...

    def emit(self, event: Event) -> None: ...

    def check_stop(self) -> None: ...


@dataclass
class Session:
    cfg: TrainConfig
    device_info: Any = None
    precision: str = "no"
    dtype: torch.dtype = torch.float32
    method: Any = None
    data: Any = None
    model: Any = None
    accelerator: Any = None
    plan: Optional[StepPlan] = None
    optimizer: Any = None
    scheduler: Any = None
    trained: list[Any] = field(default_factory=list)  # the modules with trained parameters
    base_model_hash: Optional[str] = None
    progress: Progress = field(default_factory=Progress)  # where the loop starts (resume)
    shard: Optional[tuple[int, int]] = None  # (rank, processes) with more than one process
    threads: Any = None  # trainer.system.threads.CpuThreads on the CPU backend
    ema: Any = field(default_factory=NoEma)  # training.ema_decay: trainer/run/ema.py
    fsdp: Any = None  # training.distributed = 'fsdp': trainer/run/fsdp.py's Sharded
    family: Any = None  # the model's family object, with the run's guidance (trainer/families)
    objective: Any = None  # DDPM or flow matching (trainer/objectives), built once
    heap: Any = None  # trainer.system.heap.HeapMode while training.cpu_freed_memory sets one

    def release(self) -> None:
        """Drop the models and free the device memory (the GUI process lives on)."""
        if self.accelerator is not None:
            try:
                if self.cfg.training.log_with != "none":
                    self.accelerator.end_training()
                self.accelerator.free_memory()
            except Exception:  # noqa: BLE001 - releasing must not mask the real outcome
                log.exception("accelerator release failed")
        self.model = self.accelerator = self.data = self.method = None
        self.optimizer = self.scheduler = None
        self.trained, self.ema = [], NoEma()
        self.family = self.objective = None
        gc.collect()
        if self.heap is not None:
            self.heap.restore()  # glibc's settled settings back, the free pages returned
            self.heap = None
        if self.device_info is not None:
            from trainer.system.device import empty_cache

            empty_cache(self.device_info)


def prepare(s: Session, out: Reporter) -> None:
    """Build ``s`` stage by stage; raises on bad input, with the setting or file named."""
    from trainer.data import prepare_dataset
    from trainer.families.sd.long_prompts import PromptOptions
    from trainer.methods import get_method
    from trainer.models.loader import load_base_model
    from trainer.run.class_images import ensure_class_images
    from trainer.run.failures import check_output_dir
    from trainer.run.state import load_state, resolve_resume
    from trainer.run.step import objective_for, run_family
    from trainer.system.distributed import main_process_first, rank
    from trainer.system.library_lock import library_imports

    check_output_dir(s.cfg)
    fsdp.check_processes(s.cfg)  # training.distributed = 'fsdp' on one process is refused
    resume = resolve_resume(s.cfg) if s.cfg.training.resume else None
    _device(s, out)
    s.method = get_method(s.cfg)
    with main_process_first(s.device_info):  # rank 0 first: it may build the tiny model
        s.data = prepare_dataset(s.cfg, warn=lambda m: out.log(m, "warning"))
        out.check_stop()
        with library_imports():  # the GUI's advisor may import the same classes at once
            s.model = load_base_model(s.cfg.model, s.dtype, t5_frozen=not s.method.trains_t5,
                                      defer_denoiser=text_first.applies(
                                          s.cfg, s.method, s.data, s.device_info.backend))
    s.model.prompt_options = PromptOptions.from_config(s.cfg.dataset)  # long / weighted captions
    s.family = run_family(s.model, s.cfg)
    out.check_stop()
    out.log(f"Base model: {s.model.source} ({s.model.description or s.model.version})")
    choose_cpu_precision(s, out)  # auto on a CPU with bf16 units: bf16 where it measures faster
    _check_family(s)
    with main_process_first(s.device_info), library_imports():  # rank 0 generates first
        if ensure_class_images(s.cfg, s.model, s.device_info, s.precision, out) or rank():
            s.data = prepare_dataset(s.cfg, warn=lambda m: out.log(m, "warning"))
    _noise_schedule(s, out)
    s.objective = objective_for(s.model, s.cfg)  # on the schedule the run trains with
    with library_imports():  # accelerate and its trackers import on first use too
        s.accelerator = _accelerator(s.cfg, s.device_info, s.precision)
    if s.accelerator.num_processes > 1:
        s.shard = (s.accelerator.process_index, s.accelerator.num_processes)
    release_decoder(s, out)  # nothing decodes once the class images exist (trainer/run/unused)
    with library_imports():
        s.model.vae.to(s.accelerator.device).eval()  # fp32: SD's VAE overflows in fp16
        fill_latent_cache(s, out)  # before the denoiser takes the device (trainer/run/caches.py)
        encoded = text_first.encode_and_release(s, out)  # then the transformer is built
        groups = _place_and_inject(s, out)
    _compile(s, out)
    if not encoded:
        fill_text_cache(s, out)
    out.check_stop()
    tr = s.cfg.training
    processes = s.accelerator.num_processes  # a step trains the global batch
    s.plan = plan_steps(s.data.steps_per_epoch(tr.train_batch_size * processes),
                        tr.gradient_accumulation_steps, tr.max_train_steps, tr.max_train_epochs)
    _optimizer(s, groups)
    fused_steps.install(s)  # optimizer.fused_backward_pass / fused_optimizer_groups
    s.base_model_hash = _base_hash(s.model.source)
    # what the set-up freed (the loaders' scratch, released encoders) goes back to the system
    # before step 1: the heap would keep it beside the steps' own (trainer/system/heap.py)
    gc.collect()
    give_back_free_memory()
    _heap_mode(s, out)
    if resume is not None:
        s.progress = load_state(s, resume)
        s.method.after_step(s.model, s.progress.step)  # e.g. a text encoder frozen by then
        out.log(f"Resumed from {resume} at step {s.progress.step} (epoch {s.progress.epoch}, "
                f"{s.progress.position} batches into it)")


def _heap_mode(s: Session, out: Reporter) -> None:
    """``training.cpu_freed_memory`` for a CPU run's steps (trainer/system/heap.py)."""
    from trainer.system.heap import WHAT_MODES_DO, environment_setting, set_mode

    mode = s.cfg.training.cpu_freed_memory
    if mode == "glibc" or s.device_info.backend != "cpu":
        return
    s.heap = set_mode(mode, s.device_info.backend)
    if s.heap is not None:
        out.log(f"CPU heap: {WHAT_MODES_DO[mode]} (training.cpu_freed_memory = '{mode}'; "
                "glibc malloc)")
    elif env := environment_setting():
        out.log(f"CPU heap: as {env} in the environment sets it "
                f"(training.cpu_freed_memory = '{mode}' leaves it so)")
    else:
        out.log(f"training.cpu_freed_memory = '{mode}': this C library has no glibc mallopt; "
                "the heap stays as it is", "warning")


def _device(s: Session, out: Reporter) -> None:
    from trainer.models.memory import check_memory_options
    from trainer.system.device import check_full_bf16, detect, resolve_precision
    from trainer.system.threads import adaptive_threads

    s.device_info = info = detect()
    # GPUs only; before the precision, which names fp16 alone on the CPU
    full_fp16.check(s.cfg.training.full_fp16, s.cfg.training.mixed_precision, info.backend)
    s.precision = resolve_precision(s.cfg.training.mixed_precision, info)
    s.dtype = DTYPES[s.precision]
    check_full_bf16(s.cfg.training.full_bf16, s.precision)
    check_memory_options(s.cfg, info.backend, info.label)  # before a large model loads
    out.log(f"Device: {info.summary()}; mixed precision: {s.precision}")
    s.threads = adaptive_threads(info.backend)
    if s.threads:
        out.log(f"CPU training with {s.threads.threads} thread(s), one fewer while other "
                f"processes keep a core busy (OMP_NUM_THREADS fixes the count)")


class FamilyMismatch(ValueError):
    """A setting that the loaded model's family cannot use (trainer/config/rules/family.py)."""


def _check_family(s: Session) -> None:
    """The config's family checks again with the detected family and the resolved precision:
    a checkpoint given by path names no family until it is read."""
    from trainer.config.rules.family import family_problems

    problems = family_problems(s.cfg, s.model.version, s.precision)
    if problems:
        raise FamilyMismatch("; ".join(problems))


def _noise_schedule(s: Session, out: Reporter) -> None:
    """Zero terminal SNR (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample Steps
    are Flawed"): the last timestep is pure noise; diffusers' schedulers rescale the betas."""
    if not s.cfg.training.zero_terminal_snr:
        return
    from diffusers import DDPMScheduler

    s.model.noise_scheduler = DDPMScheduler.from_config(s.model.noise_scheduler.config,
                                                        rescale_betas_zero_snr=True)
    if s.model.prediction_type != "v_prediction":
        out.log("training.zero_terminal_snr with an epsilon-prediction model: at the last "
                "timestep there is no noise to predict; the paper pairs it with v-prediction "
                "(set model.prediction_type = 'v_prediction' for a v model)", "warning")


def _accelerator(cfg: TrainConfig, info: Any, precision: str):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import set_seed

    from trainer.run import trackers
    from trainer.run.outputs import flat_hparams

    AcceleratorState._reset_state(reset_partial_state=True)
    tr = cfg.training
    log_dir = Path(tr.logging_dir or Path(cfg.saving.output_dir) / "logs")
    acc = Accelerator(
        mixed_precision=precision, cpu=info.backend == "cpu",
        gradient_accumulation_steps=tr.gradient_accumulation_steps,
        log_with=trackers.log_with(cfg), project_dir=str(log_dir),
    )
    set_seed(tr.seed)
    if tr.full_fp16:  # fp16 gradients through accelerate's scaler, as sd-scripts patches it
        full_fp16.patch_scaler(acc)
    if tr.log_with != "none":  # trainer/run/trackers.py: TensorBoard, W&B
        acc.init_trackers(trackers.project_name(cfg), config=flat_hparams(cfg),
                          init_kwargs=trackers.init_kwargs(cfg, log_dir))
    return acc


def _networks(model: Any) -> list[Any]:
    """The UNet and the text encoder(s): what a method may train."""
    from trainer.families import family_of

    return [model.denoiser] + [enc for _, enc, _ in family_of(model).text_encoders(model)
                           if not text_first.released(enc)]


def _trained_modules(model: Any) -> list[Any]:
    return [m for m in _networks(model) if any(p.requires_grad for p in m.parameters())]


def _place_and_inject(s: Session, out: Reporter) -> list[dict[str, Any]]:
    """Move the model to the device, let the method choose what trains, set the modes."""
    from diffusers.training_utils import cast_training_params

    model, device, tr = s.model, s.accelerator.device, s.cfg.training
    memory = _memory_plan(s, out)  # fp8 / NF4 base, block swap
    place = fsdp.placement(s.cfg, device)  # FSDP: the CPU, sharding moves them block by block
    whole = s.method.whole_modules(model)  # trained whole: fp32 weights, as loaded
    for module in _networks(model):
        if memory.holds(module):
            continue
        if s.dtype == torch.float32 or any(module is m for m in whole):
            module.to(place)
        else:
            module.to(place, s.dtype)
    cpu_bf16_norms(s.device_info.backend, s.dtype, _networks(model))  # mixed dtype
    groups = s.method.prepare(model)
    trained = _trained_modules(model)
    # trained weights in fp32 (or bf16 / fp16 with full_bf16 / full_fp16); the frozen rest at
    # the compute dtype
    cast_training_params(trained, dtype=full_fp16.trained_dtype(tr))
    groups = fsdp.shard(s, trained, _networks(model), groups)  # training.distributed = 'fsdp'
    memory.finish(out.log)
    encoders = _networks(model)[1:]
    for encoder in encoders:  # a frozen encoder runs in eval mode (no dropout, no grad)
        encoder.train(s.method.trains_text_encoder and encoder in trained)
    model.denoiser.train()
    if tr.gradient_checkpointing:
        model.denoiser.enable_gradient_checkpointing()
        for encoder in encoders:
            if encoder.training:
                encoder.gradient_checkpointing_enable()
    return groups


def _memory_plan(s: Session, out: Reporter) -> Any:
    """The memory options' plan for this model (trainer/models/memory.py), begun: refused on
    a backend that cannot run them, quantized base weights in place."""
    from trainer.models.memory import MemoryPlan

    plan = MemoryPlan(s.cfg, s.model, s.dtype, s.accelerator.device)
    plan.begin(s.device_info.backend, s.device_info.label, out.log)
    return plan


def _compile(s: Session, out: Reporter) -> None:
    """torch.compile of the UNet, in place (``Module.compile``): names, hooks and the saved
    files stay as they are; only the forward runs through the compiler."""
    from trainer.system.speed import CompileUnavailable, compile_options, compile_problem

    if not s.cfg.training.compile:
        return
    problem = compile_problem(s.device_info.backend)
    if problem:
        raise CompileUnavailable(f"training.compile is on, but {problem}")
    if s.cfg.training.compile_scope == "regional":  # one block of each kind
        from trainer.run.regional_compile import compile_regional

        count = compile_regional(s.model.denoiser, compile_options())
        out.log(f"{count} repeated blocks compiled with torch.compile (regional): the first "
                f"steps wait for the compiler")
        return
    s.model.denoiser.compile(**compile_options())
    out.log("UNet compiled with torch.compile: the first steps wait for the compiler")


def _optimizer(s: Session, groups: list[dict[str, Any]]) -> None:
    from trainer.optim.optimizers import make_optimizer, make_scheduler
    from trainer.system.distributed import broadcast_params

    optimizer = make_optimizer(s.cfg.optimizer, groups, s.device_info.backend)
    s.ema = make_ema(s.cfg, [p for g in optimizer.param_groups for p in g["params"]])
    s.scheduler = make_scheduler(s.cfg.optimizer, optimizer, s.plan.total_steps)
    s.trained = _trained_modules(s.model)
    if s.accelerator.num_processes > 1:  # no DDP wrapper: see trainer/system/distributed.py
        s.optimizer = s.accelerator.prepare_optimizer(optimizer)
        if s.fsdp is None:  # FSDP: every process loaded the same file and keeps its shard
            broadcast_params(s.trained, s.accelerator)
            for module in s.trained:  # prepare's autocast (as one process has), without DDP
                s.accelerator.prepare_model(module, device_placement=False, evaluation_mode=True)
        return
    s.optimizer = s.accelerator.prepare(*s.trained, optimizer)[-1]


def _base_hash(source: str) -> Optional[str]:
    from trainer.export.hashes import model_short_hash

    try:
        return model_short_hash(Path(source))
    except OSError:
        return None
