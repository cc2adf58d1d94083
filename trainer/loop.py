"""The training loop: ``run(cfg, sink, control)``, the one entry point of the trainer.

It detects the device once, checks the data and the model before the first step, then runs a
plain loop of steps that a newcomer can read top to bottom. It talks only through events and
reads Control at step boundaries; it never changes its config.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional

import torch

from trainer import config_io
from trainer.config import TrainConfig
from trainer.events import (
    Checkpoint,
    Control,
    EventSink,
    Finished,
    Log,
    NullSink,
    Sample,
    Started,
    Step,
    safe_emit,
)
from trainer.plan import Meter, StepPlan, plan_steps
from trainer.step import batch_loss, encode_captions, encode_images

log = logging.getLogger(__name__)


def run(cfg: TrainConfig, sink: Optional[EventSink] = None,
        control: Optional[Control] = None) -> Finished:
    """Train as the config says. Never raises for a training error: it ends in Finished."""
    job = _Job(cfg, sink or NullSink(), control or Control())
    try:
        status = job.train()
        result = Finished(status, job.step, output_path=job.output_path)
    except _StoppedBeforeTraining:
        job.log("Stopped before the first step; nothing was trained or saved")
        result = Finished("stopped", 0)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a Finished event
        expected = _is_user_error(exc)
        if not expected:
            log.exception("training failed")
        message = str(exc) if expected else f"{type(exc).__name__}: {exc}"
        job.log(f"Failed: {message}", "error")
        result = Finished("failed", job.step, output_path=job.output_path, error=message)
    finally:
        job.release()
    safe_emit(job.sink, result)
    return result


class _StoppedBeforeTraining(Exception):
    """Stop was pressed while the data or the model were being prepared."""


def _is_user_error(exc: Exception) -> bool:
    """Errors whose message already says what to do (bad config, data, model, device)."""
    return isinstance(exc, ValueError) and type(exc) is not ValueError or isinstance(
        exc, FileNotFoundError)


class _Job:
    def __init__(self, cfg: TrainConfig, sink: EventSink, control: Control):
        self.cfg, self.sink, self.control = cfg, sink, control
        self.step = 0
        self.output_path: Optional[str] = None
        self.model: Any = None
        self.accelerator: Any = None
        self.device_info: Any = None
        self.optimizer: Any = None
        self.data: Any = None
        self.method: Any = None
        self.plan: Optional[StepPlan] = None
        self.started_at = time.time()

    def log(self, message: str, level: str = "info") -> None:
        getattr(log, "warning" if level == "warning" else "info")(message)
        safe_emit(self.sink, Log(message, level))

    def warn(self, message: str) -> None:
        self.log(message, "warning")

    def _stop_if_requested(self) -> None:
        if self.control.stop_requested:
            raise _StoppedBeforeTraining

    # -- set-up -------------------------------------------------------------------------------
    def train(self) -> str:
        from trainer.data import prepare_dataset
        from trainer.device import (
            check_full_bf16,
            configure_cpu_threads,
            detect,
            resolve_precision,
        )
        from trainer.methods import get_method
        from trainer.models.loader import load_base_model

        cfg = self.cfg
        self.device_info = info = detect()
        precision = resolve_precision(cfg.training.mixed_precision, info)
        check_full_bf16(cfg.training.full_bf16, precision)
        method = get_method(cfg)
        self.log(f"Device: {info.summary()}; mixed precision: {precision}")
        threads = configure_cpu_threads(info)
        if threads:
            self.log(f"CPU training with {threads} thread(s), leaving a core free "
                     f"(set OMP_NUM_THREADS to choose)")
        data = prepare_dataset(cfg, warn=self.warn)
        self._stop_if_requested()
        self.model = model = load_base_model(cfg.model)
        self._stop_if_requested()
        self.log(f"Base model: {model.source} ({model.version}, {model.prediction_type})")
        self.accelerator = acc = self._accelerator(precision)
        dtype = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        groups = self._place_and_inject(method, model, acc.device, dtype)
        self._cache(data, model)
        self._stop_if_requested()
        self.data, self.method = data, method
        self.plan = plan = plan_steps(data.steps_per_epoch(cfg.training.train_batch_size),
                          cfg.training.gradient_accumulation_steps,
                          cfg.training.max_train_steps, cfg.training.max_train_epochs)
        optimizer, scheduler, trained = self._optimizer(groups, plan, info.backend)
        self.optimizer = optimizer
        self._started(precision)
        return self._loop(optimizer, scheduler, trained, dtype)

    def _accelerator(self, precision: str):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState
        from accelerate.utils import set_seed

        AcceleratorState._reset_state(reset_partial_state=True)
        tr = self.cfg.training
        log_dir = Path(tr.logging_dir or Path(self.cfg.saving.output_dir) / "logs")
        acc = Accelerator(
            mixed_precision=precision, cpu=self.device_info.backend == "cpu",
            gradient_accumulation_steps=tr.gradient_accumulation_steps,
            log_with=None if tr.log_with == "none" else tr.log_with, project_dir=str(log_dir),
        )
        set_seed(tr.seed)
        if tr.log_with != "none":
            acc.init_trackers(self.cfg.saving.output_name, config=_flat_hparams(self.cfg))
        return acc

    def _place_and_inject(self, method, model, device, dtype) -> list[dict[str, Any]]:
        from diffusers.training_utils import cast_training_params

        model.vae.to(device).eval()  # the VAE stays fp32: SD's VAE overflows in fp16
        for module in (model.unet, model.text_encoder):
            module.to(device) if dtype == torch.float32 else module.to(device, dtype)
        groups = method.prepare(model)
        trained = [m for m in (model.unet, model.text_encoder)
                   if any(p.requires_grad for p in m.parameters())]
        keep = torch.bfloat16 if self.cfg.training.full_bf16 else torch.float32
        cast_training_params(trained, dtype=keep)
        model.text_encoder.train(method.trains_text_encoder)
        model.unet.train()
        if self.cfg.training.gradient_checkpointing:
            model.unet.enable_gradient_checkpointing()
            if method.trains_text_encoder:
                model.text_encoder.gradient_checkpointing_enable()
        return groups

    def _cache(self, data, model) -> None:
        ds = self.cfg.dataset
        if ds.cache_latents:
            start = time.time()
            # hashing the VAE's weights is only worth it for a cache that outlives the run
            vae_id = model.vae_id if ds.cache_latents_to_disk else "in-memory"
            with torch.no_grad():
                encoded = data.cache_latents(lambda px: encode_images(model.vae, px), vae_id,
                                             to_disk=ds.cache_latents_to_disk,
                                             cache_dir=Path(ds.cache_dir) if ds.cache_dir
                                             else None)
            self.log(f"Latent cache ready: {encoded} image(s) encoded in "
                     f"{time.time() - start:.1f}s")
            if not self.cfg.sampling.sample_prompts:
                model.vae.to("cpu")  # not needed on the device any more
        if ds.cache_text_encoder_outputs:  # prepare_dataset refused it where it is not valid
            with torch.no_grad():
                data.cache_text(lambda caps: encode_captions(model, caps, self.cfg.model.clip_skip))

    def _optimizer(self, groups, plan: StepPlan, backend: str):
        from trainer.optim import make_optimizer, make_scheduler

        optimizer = make_optimizer(self.cfg.optimizer, groups, backend)
        scheduler = make_scheduler(self.cfg.optimizer, optimizer, plan.total_steps)
        trained = [m for m in (self.model.unet, self.model.text_encoder)
                   if any(p.requires_grad for p in m.parameters())]
        prepared = self.accelerator.prepare(*trained, optimizer)
        return prepared[-1], scheduler, trained

    def _started(self, precision: str) -> None:
        tr, data, plan = self.cfg.training, self.data, self.plan
        self.log(f"{data.num_images} images, {data.num_repeated} with repeats; batch "
                 f"{tr.train_batch_size} x accumulation {tr.gradient_accumulation_steps}: "
                 f"{plan.steps_per_epoch} steps/epoch x {plan.epochs} epochs = "
                 f"{plan.total_steps} steps")
        self.log("Buckets: " + ", ".join(f"{k}: {v}" for k, v in data.bucket_table().items()))
        self.started_at = time.time()
        safe_emit(self.sink, Started(
            total_steps=plan.total_steps, epochs=plan.epochs,
            steps_per_epoch=plan.steps_per_epoch, num_images=data.num_images,
            num_repeated_images=data.num_repeated, batch_size=tr.train_batch_size,
            gradient_accumulation_steps=tr.gradient_accumulation_steps,
            buckets=data.bucket_table(), device=self.device_info.summary(),
            mixed_precision=precision, output_dir=str(self.cfg.saving.output_dir)))

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self, optimizer, scheduler, trained, dtype) -> str:
        cfg, acc, plan = self.cfg, self.accelerator, self.plan
        params = [p for g in optimizer.param_groups for p in g["params"]]
        meter = Meter()
        for epoch in range(1, plan.epochs + 1):
            for batch in self.data.epoch(epoch, cfg.training.train_batch_size, cfg.training.seed):
                with acc.accumulate(*trained):
                    loss = batch_loss(batch, self.model, cfg, acc.device, dtype)
                    acc.backward(loss)
                    if acc.sync_gradients and cfg.optimizer.max_grad_norm > 0:
                        acc.clip_grad_norm_(params, cfg.optimizer.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                if not acc.sync_gradients:
                    continue
                scheduler.step()
                self.step += 1
                self._after_step(epoch, loss.item(), scheduler, meter)
                if self.control.stop_requested:
                    self.log(f"Stop requested: saving at step {self.step}")
                    self._checkpoint(epoch, "")
                    return "stopped"
                if self.step >= plan.total_steps:
                    break
            self._after_epoch(epoch)
            if self.step >= plan.total_steps:
                break
        self._checkpoint(min(epoch, plan.epochs), "")
        return "finished"

    def _after_step(self, epoch, loss, scheduler, meter) -> None:
        plan = self.plan
        meter.update(loss, time.time())
        lr = scheduler.get_last_lr()[0]
        safe_emit(self.sink, Step(step=self.step, total_steps=plan.total_steps, epoch=epoch,
                                  loss=loss, loss_avg=meter.loss_avg, lr=lr,
                                  it_per_s=meter.it_per_s,
                                  eta_s=meter.eta(plan.total_steps - self.step)))
        if self.cfg.training.log_with != "none":
            self.accelerator.log({"loss": loss, "loss_avg": meter.loss_avg, "lr": lr},
                                 step=self.step)
        sv, sm = self.cfg.saving, self.cfg.sampling
        if self.control.take_save_request() or (
                sv.save_every_n_steps and self.step % sv.save_every_n_steps == 0
                and self.step < plan.total_steps):
            self._checkpoint(epoch, f"-step{self.step:08d}")
        if self.control.take_sample_request() or (
                sm.sample_every_n_steps and self.step % sm.sample_every_n_steps == 0):
            self._sample()

    def _after_epoch(self, epoch) -> None:
        sv, sm = self.cfg.saving, self.cfg.sampling
        if sv.save_every_n_epochs and epoch % sv.save_every_n_epochs == 0 \
                and epoch < self.plan.epochs:
            self._checkpoint(epoch, f"-{epoch:06d}")
        if sm.sample_every_n_epochs and epoch % sm.sample_every_n_epochs == 0:
            self._sample()

    # -- outputs ------------------------------------------------------------------------------
    def _checkpoint(self, epoch: int, suffix: str) -> Path:
        """Save what was trained; the final file (suffix '') becomes the run's output."""
        from trainer.outputs import run_facts

        out_dir = Path(self.cfg.saving.output_dir)
        path = out_dir / f"{self.cfg.saving.output_name}{suffix}.safetensors"
        facts = run_facts(self.cfg, self.model, self.data, self.plan, epoch, self.step,
                          self.started_at, self.accelerator.mixed_precision, self.optimizer)
        self.method.save(path, self.model, facts)
        config_io.save(self.cfg, path.with_suffix(".toml"))
        self.log(f"Saved {path}")
        safe_emit(self.sink, Checkpoint(step=self.step, epoch=epoch, path=str(path)))
        if not suffix:
            self.output_path = str(path)
        return path

    def _sample(self) -> None:
        from trainer.sampling import make_samples

        prompts = self.cfg.sampling.sample_prompts
        if not prompts:
            return
        paths = make_samples(self.model, self.cfg, self.step, self.accelerator)
        self.log(f"Sample images: {', '.join(str(p) for p in paths)}")
        safe_emit(self.sink, Sample(step=self.step, paths=tuple(str(p) for p in paths),
                                    prompts=tuple(prompts)))

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
        gc.collect()
        if self.device_info is not None:
            from trainer.device import empty_cache

            empty_cache(self.device_info)


def _flat_hparams(cfg: TrainConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config_io.to_dict(cfg).items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        for name, v in items:
            if isinstance(v, (int, float, str, bool)) and not (isinstance(v, float)
                                                               and math.isnan(v)):
                out[f"{key}.{name}".strip(".")] = v
    return out
