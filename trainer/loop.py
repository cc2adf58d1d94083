"""The training loop: ``run(cfg, sink, control)``, the one entry point of the trainer.

:func:`trainer.session.prepare` builds everything before the first step (device, data, model,
method, caches, optimizer); the loop below runs the steps, and :mod:`trainer.outputs` saves
files and samples. Every mode (LoRA, DreamBooth, textual inversion) runs this same loop: what
differs lives in its method (trainer/methods/). The loop talks only through events, reads
Control at step boundaries and never changes its config.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from trainer.config import TrainConfig
from trainer.events import (
    Control,
    Event,
    EventSink,
    Finished,
    Log,
    NullSink,
    Started,
    Step,
    safe_emit,
)
from trainer.plan import Meter

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
        if job.session is not None:
            job.session.release()
    safe_emit(job.sink, result)
    return result


class _StoppedBeforeTraining(Exception):
    """Stop was pressed while the data or the model were being prepared."""


def _is_user_error(exc: Exception) -> bool:
    """Errors whose message already says what to do (bad config, data, model, device)."""
    return isinstance(exc, ValueError) and type(exc) is not ValueError or isinstance(
        exc, FileNotFoundError)


class _Job:
    """One run: the session it prepares, the step counter, and the reporter set-up uses."""

    def __init__(self, cfg: TrainConfig, sink: EventSink, control: Control):
        self.cfg, self.sink, self.control = cfg, sink, control
        self.step = 0
        self.output_path: Optional[str] = None
        self.session = None
        self.started_at = time.time()
        self._sampled_at: Optional[int] = None

    # the Reporter of trainer.session
    def log(self, message: str, level: str = "info") -> None:
        getattr(log, "warning" if level == "warning" else "info")(message)
        safe_emit(self.sink, Log(message, level))

    def emit(self, event: Event) -> None:
        safe_emit(self.sink, event)

    def check_stop(self) -> None:
        if self.control.stop_requested:
            raise _StoppedBeforeTraining

    def train(self) -> str:
        from trainer.session import Session, prepare

        self.session = Session(self.cfg)
        prepare(self.session, self)
        self._started()
        return self._loop()

    def _started(self) -> None:
        s, tr = self.session, self.cfg.training
        data, plan = s.data, s.plan
        self.log(f"{data.num_images} images, {data.num_repeated} with repeats; batch "
                 f"{tr.train_batch_size} x accumulation {tr.gradient_accumulation_steps}: "
                 f"{plan.steps_per_epoch} steps/epoch x {plan.epochs} epochs = "
                 f"{plan.total_steps} steps")
        self.log("Buckets: " + ", ".join(f"{k}: {v}" for k, v in data.bucket_table().items()))
        self.started_at = time.time()
        self.emit(Started(
            total_steps=plan.total_steps, epochs=plan.epochs,
            steps_per_epoch=plan.steps_per_epoch, num_images=data.num_images,
            num_repeated_images=data.num_repeated, batch_size=tr.train_batch_size,
            gradient_accumulation_steps=tr.gradient_accumulation_steps,
            buckets=data.bucket_table(), device=s.device_info.summary(),
            mixed_precision=s.precision, output_dir=str(self.cfg.saving.output_dir)))

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> str:
        from trainer.step import batch_loss

        s, cfg = self.session, self.cfg
        acc, plan, model = s.accelerator, s.plan, s.model
        params = [p for g in s.optimizer.param_groups for p in g["params"]]
        meter = Meter()
        for epoch in range(1, plan.epochs + 1):
            for batch in s.data.epoch(epoch, cfg.training.train_batch_size, cfg.training.seed):
                with acc.accumulate(*s.trained):
                    loss = batch_loss(batch, model, cfg, acc.device, s.dtype)
                    acc.backward(loss)
                    if acc.sync_gradients and cfg.optimizer.max_grad_norm > 0:
                        acc.clip_grad_norm_(params, cfg.optimizer.max_grad_norm)
                    s.optimizer.step()
                    s.optimizer.zero_grad(set_to_none=True)
                if not acc.sync_gradients:
                    continue
                s.scheduler.step()
                self.step += 1
                note = s.method.after_step(model, self.step)
                if note:
                    self.log(note)
                self._after_step(epoch, loss.item(), meter)
                if self.control.stop_requested:
                    self.log(f"Stop requested: saving at step {self.step}")
                    self._save(epoch, "")
                    return "stopped"
                if self.step >= plan.total_steps:
                    break
            self._after_epoch(epoch)
            if self.step >= plan.total_steps:
                break
        self._save(min(epoch, plan.epochs), "")
        return "finished"

    def _after_step(self, epoch: int, loss: float, meter: Meter) -> None:
        s, step = self.session, self.step
        meter.update(loss, time.time())
        lr = s.scheduler.get_last_lr()[0]
        self.emit(Step(step=step, total_steps=s.plan.total_steps, epoch=epoch, loss=loss,
                       loss_avg=meter.loss_avg, lr=lr, it_per_s=meter.it_per_s,
                       eta_s=meter.eta(s.plan.total_steps - step)))
        if self.cfg.training.log_with != "none":
            s.accelerator.log({"loss": loss, "loss_avg": meter.loss_avg, "lr": lr}, step=step)
        sv, sm = self.cfg.saving, self.cfg.sampling
        if self.control.take_save_request() or (
                sv.save_every_n_steps and step % sv.save_every_n_steps == 0
                and step < s.plan.total_steps):
            self._save(epoch, f"-step{step:08d}")
        if self.control.take_sample_request() or (
                sm.sample_every_n_steps and step % sm.sample_every_n_steps == 0):
            self._samples()

    def _after_epoch(self, epoch: int) -> None:
        sv, sm = self.cfg.saving, self.cfg.sampling
        if sv.save_every_n_epochs and epoch % sv.save_every_n_epochs == 0 \
                and epoch < self.session.plan.epochs:
            self._save(epoch, f"-{epoch:06d}")
        if sm.sample_every_n_epochs and epoch % sm.sample_every_n_epochs == 0:
            self._samples()

    # -- outputs ------------------------------------------------------------------------------
    def _save(self, epoch: int, suffix: str) -> None:
        from trainer.outputs import save_checkpoint

        path = save_checkpoint(self.session, self, epoch, self.step, suffix, self.started_at)
        if not suffix:
            self.output_path = str(path)

    def _samples(self) -> None:
        from trainer.outputs import save_samples

        if self._sampled_at == self.step:  # e.g. every N steps and the end of an epoch
            return
        self._sampled_at = self.step
        save_samples(self.session, self, self.step)
