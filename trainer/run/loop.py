"""The training loop: ``run(cfg, sink, control)``, the one entry point of the trainer.

:func:`trainer.run.session.prepare` builds everything before the first step (device, data, model,
method, caches, optimizer); the loop below runs the steps, and :mod:`trainer.run.outputs` saves
files and samples. Every mode (LoRA, DreamBooth, textual inversion) runs this same loop: what
differs lives in its method (trainer/methods/). The loop talks only through events, reads
Control at step boundaries and never changes its config.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from trainer.config import TrainConfig
from trainer.events import Control, EventSink, Finished, NullSink, Started, Step, safe_emit
from trainer.optim.lr import effective_lr, lr_notes
from trainer.run.meter import Meter
from trainer.run.reporter import Reporter, StoppedBeforeTraining
from trainer.run.state import Progress

log = logging.getLogger(__name__)


def run(cfg: TrainConfig, sink: Optional[EventSink] = None,
        control: Optional[Control] = None) -> Finished:
    """Train as the config says. Never raises for a training error: it ends in Finished."""
    job = _Job(cfg, Reporter(sink or NullSink(), control or Control()))
    out = job.out
    try:
        status = job.train()
        result = Finished(status, job.progress.step, output_path=job.output_path)
    except StoppedBeforeTraining:
        out.log("Stopped before the first step; nothing was trained or saved")
        result = Finished("stopped", 0)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a Finished event
        exc = _explained(exc, job)
        expected = _is_user_error(exc)
        if not expected:
            log.exception("training failed")
        message = str(exc) if expected else f"{type(exc).__name__}: {exc}"
        out.log(f"Failed: {message}", "error")
        result = Finished("failed", job.progress.step, output_path=job.output_path,
                          error=message)
    finally:
        if job.session is not None:
            job.session.release()
    safe_emit(out.sink, result)
    return result


def _explained(exc: Exception, job: _Job) -> Exception:
    """Out of device memory becomes advice for this config (the memory is freed after); a
    torch.compile cache that a killed compile left broken says which folder to delete."""
    from trainer.run.failures import is_out_of_memory, out_of_memory
    from trainer.system.speed import broken_compile_cache

    if not is_out_of_memory(exc):
        return broken_compile_cache(exc) or exc
    info = job.session.device_info if job.session is not None else None
    return out_of_memory(job.cfg, info, job.progress.step + 1)


def _is_user_error(exc: Exception) -> bool:
    """Errors whose message already says what to do (bad config, data, model, device)."""
    return isinstance(exc, ValueError) and type(exc) is not ValueError or isinstance(
        exc, FileNotFoundError)


class _Job:
    """The loop of one run: it prepares the session, then trains it step by step; ``out``
    (a :class:`~trainer.run.reporter.Reporter`) is how it talks and ``progress`` (the one
    :class:`~trainer.run.state.Progress`) where it is."""

    def __init__(self, cfg: TrainConfig, out: Reporter):
        self.cfg, self.out = cfg, out
        self.progress = Progress()
        self.epoch_done = False  # every batch of progress.epoch was trained
        self.output_path: Optional[str] = None
        self.session = None
        self.started_at = time.time()
        self.meter = Meter()

    def train(self) -> str:
        from trainer.run.session import Session, prepare

        self.session = Session(self.cfg)
        prepare(self.session, self.out)
        self._started()
        return self._loop()

    def _started(self) -> None:
        s, tr = self.session, self.cfg.training
        data, plan = s.data, s.plan
        n = s.accelerator.num_processes
        per_step = f" x {n} processes = {tr.train_batch_size * n} images per batch" if n > 1 \
            else ""
        out = self.out
        out.log(f"{data.num_images} images, {data.num_repeated} with repeats; batch "
                f"{tr.train_batch_size}{per_step} x accumulation "
                f"{tr.gradient_accumulation_steps}: "
                f"{plan.steps_per_epoch} steps/epoch x {plan.epochs} epochs = "
                f"{plan.total_steps} steps")
        out.log("Buckets: " + ", ".join(f"{k}: {v}" for k, v in data.bucket_table().items()))
        for note in lr_notes(self.cfg.optimizer):
            out.log(note, "warning")
        self.started_at = time.time()
        out.emit(Started(
            total_steps=plan.total_steps, epochs=plan.epochs,
            steps_per_epoch=plan.steps_per_epoch, num_images=data.num_images,
            num_repeated_images=data.num_repeated, batch_size=tr.train_batch_size,
            gradient_accumulation_steps=tr.gradient_accumulation_steps,
            buckets=data.bucket_table(), device=s.device_info.summary(),
            mixed_precision=s.precision, output_dir=str(self.cfg.saving.output_dir)))

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> str:
        from trainer.run.failures import check_loss
        from trainer.run.step import batch_loss
        from trainer.system.distributed import (
            average_gradients,
            check_in_step,
            mean_loss,
            stop_agreed,
        )

        s, cfg, at = self.session, self.cfg, self.progress
        acc, plan, model, start = s.accelerator, s.plan, s.model, s.progress
        params = [p for g in s.optimizer.param_groups for p in g["params"]]
        at.step, at.epoch, at.sampled_at = start.step, start.epoch, start.sampled_at
        self.meter.losses.extend(start.losses)
        for epoch in range(start.epoch, plan.epochs + 1):
            at.epoch, self.epoch_done = epoch, False
            at.position = start.position if epoch == start.epoch else 0
            for batch in s.data.epoch(epoch, cfg.training.train_batch_size, cfg.training.seed,
                                      skip=at.position, shard=s.shard):
                at.position += 1
                with acc.accumulate(*s.trained):
                    loss = batch_loss(batch, model, cfg, acc.device, s.dtype, s.family,
                                      s.objective)
                    check_loss(loss, at.step + 1, cfg, s.precision, batch.paths)
                    acc.backward(loss)
                    if acc.sync_gradients:
                        if s.fsdp is None:  # FSDP reduce-scatters in the backward pass
                            average_gradients(params, acc)  # more than one process (DDP)
                        self._clip(params)
                    s.optimizer.step()
                    s.optimizer.zero_grad(set_to_none=True)
                if not acc.sync_gradients:
                    continue
                s.scheduler.step()
                s.ema.update()  # training.ema_decay (a no-op without it)
                at.step += 1
                note = s.method.after_step(model, at.step)
                if note:
                    self.out.log(note)
                if s.fsdp is None:  # FSDP's shards differ between processes by design
                    check_in_step(params, acc, at.step)
                self._after_step(epoch, mean_loss(loss, acc))
                if stop_agreed(self.out.control.stop_requested, acc):  # rank 0 decides
                    self.out.log(f"Stop requested: saving at step {at.step}")
                    self._save(epoch, "")
                    return "stopped"
                if at.step >= plan.total_steps:
                    break
            else:  # every batch of the epoch was trained
                self.epoch_done = True
            self._after_epoch(epoch)
            if at.step >= plan.total_steps:
                break
        self._save(min(at.epoch, plan.epochs), "")
        return "finished"

    def _clip(self, params: list) -> None:
        """Clip the gradients (max_grad_norm 0: measure only) and refuse non-finite ones."""
        from trainer.run.failures import check_grad_norm

        s, max_norm = self.session, self.cfg.optimizer.max_grad_norm
        if getattr(s.optimizer, "clips_each_parameter", False):
            return  # fused steps: each gradient was clipped in the backward pass
        norm = s.accelerator.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        check_grad_norm(norm, self.progress.step + 1, self.cfg, s.precision)

    def _after_step(self, epoch: int, loss: float) -> None:
        s, step, meter, out = self.session, self.progress.step, self.meter, self.out
        if s.threads is not None and s.threads.tick():
            out.log(f"CPU threads: {s.threads.threads} (other processes use "
                     f"{s.threads.changes[-1][1]:.1f} cores)")
        meter.update(loss, time.time())
        lr = effective_lr(s.optimizer, s.scheduler)  # d*lr, Adafactor's relative step
        out.emit(Step(step=step, total_steps=s.plan.total_steps, epoch=epoch, loss=loss,
                       loss_avg=meter.loss_avg, lr=lr, it_per_s=meter.it_per_s,
                       eta_s=meter.eta(s.plan.total_steps - step)))
        if self.cfg.training.log_with != "none":
            s.accelerator.log({"loss": loss, "loss_avg": meter.loss_avg, "lr": lr}, step=step)
        from trainer.run.validation import maybe_validate  # the validation loss, when it is due

        # rank 0 alone validates, samples and saves; with FSDP every process takes part
        if s.accelerator.is_main_process or s.fsdp is not None:
            maybe_validate(s, step, out)
        sv, sm = self.cfg.saving, self.cfg.sampling
        if out.control.take_sample_request() or (
                sm.sample_every_n_steps and step % sm.sample_every_n_steps == 0):
            self._samples()
        if out.control.take_save_request() or (
                sv.save_every_n_steps and step % sv.save_every_n_steps == 0
                and step < s.plan.total_steps):
            self._save(epoch, f"-step{step:08d}")

    def _after_epoch(self, epoch: int) -> None:
        """At an epoch's end, and at the end of a last epoch cut short by max_train_steps (a
        state saved then continues inside that epoch: ``epoch_done`` stays off)."""
        sv, sm = self.cfg.saving, self.cfg.sampling
        if sm.sample_every_n_epochs and epoch % sm.sample_every_n_epochs == 0:
            self._samples()
        if sv.save_every_n_epochs and epoch % sv.save_every_n_epochs == 0 \
                and epoch < self.session.plan.epochs:
            self._save(epoch, f"-{epoch:06d}")

    # -- outputs ------------------------------------------------------------------------------
    def _save(self, epoch: int, suffix: str) -> None:
        from trainer.run.outputs import save_checkpoint

        s, p = self.session, self.progress
        if not s.accelerator.is_main_process and s.fsdp is None:
            return
        state = p.to_save(self.epoch_done, s.accelerator.step, self.meter.losses) \
            if self.cfg.saving.save_state else None
        path = save_checkpoint(s, self.out, epoch, p.step, suffix, self.started_at, state)
        if not suffix:
            self.output_path = str(path)

    def _samples(self) -> None:
        from trainer.run.outputs import save_samples

        p = self.progress
        if not self.session.accelerator.is_main_process and self.session.fsdp is None:
            return
        if p.sampled_at == p.step:  # e.g. every N steps and the end of an epoch
            return
        p.sampled_at = p.step
        save_samples(self.session, self.out, p.step)
