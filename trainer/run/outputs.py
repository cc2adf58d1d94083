"""The outputs of a run: saved files (with the resolved config beside them) and sample images.

The loop calls :func:`save_checkpoint` and :func:`save_samples`; what a saved file holds is the
method's business (``method.save``), the naming and the events are the same for every mode:
``<output_name><suffix>.safetensors`` with ``<output_name><suffix>.toml`` beside it, where the
suffix is ``""`` for the final file, ``-<epoch:06d>`` or ``-step<step:08d>`` for the others.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig
from trainer.config import files as config_io
from trainer.events import Checkpoint, Sample
from trainer.optim.lr import averaged_weights


def run_facts(s: Any, epoch: int, step: int, started_at: float):
    """A :class:`~trainer.export.metadata.RunFacts` of session ``s`` for a save at ``step``."""
    from trainer.export.metadata import RunFacts

    data, model, plan = s.data, s.model, s.plan
    train = [c for c, e in zip(data.counts, data.entries) if not e.is_reg]
    reg = [c for c, e in zip(data.counts, data.entries) if e.is_reg]
    buckets = {i: {"resolution": tuple(int(x) for x in name.split("x")), "count": count}
               for i, (name, count) in enumerate(data.bucket_table().items())}
    opt_name = None
    if s.optimizer is not None:
        inner = getattr(s.optimizer, "optimizer", s.optimizer)  # accelerate wraps it
        opt_name = f"{type(inner).__module__}.{type(inner).__name__}"
    single_file = Path(model.source).is_file()
    return RunFacts(
        steps=step, epoch=epoch, max_train_steps=plan.total_steps, num_epochs=plan.epochs,
        num_batches_per_epoch=plan.batches_per_epoch, num_train_images=sum(train),
        num_reg_images=sum(reg), dataset_dirs=data.dataset_dirs(),
        tag_frequency=data.tag_frequency(), bucket_info={"buckets": buckets},
        training_started_at=started_at, base_model_version=model.version,
        prediction_type=model.prediction_type, mixed_precision=s.accelerator.mixed_precision,
        optimizer=opt_name, sd_model_hash=s.base_model_hash if single_file else None,
        base_model_hash=s.base_model_hash, num_processes=s.accelerator.num_processes,
    )


def save_checkpoint(s: Any, out: Any, epoch: int, step: int, suffix: str,
                    started_at: float, progress: Any = None) -> Path:
    """Save what was trained; suffix ``""`` is the run's final output. With ``progress`` (a
    :class:`trainer.run.state.Progress`) the training state is saved beside it. Rank 0 alone
    calls it, except with FSDP: every process then takes part in gathering the weights, and
    rank 0 writes."""
    from trainer.run.failures import disk_full
    from trainer.run.fsdp import full_model
    from trainer.run.hub import upload_save
    from trainer.run.keep_last import keep_last
    from trainer.run.state import save_state

    cfg, main = s.cfg, s.accelerator.is_main_process
    path = Path(cfg.saving.output_dir) / f"{cfg.saving.output_name}{suffix}.safetensors"
    facts = run_facts(s, epoch, step, started_at)
    try:
        # schedule-free's averaged weights; the EMA's with saving.use_ema_weights
        with averaged_weights(s.optimizer), s.ema.applied(), full_model(s) as model:
            if main:  # FSDP: the gathered copy on rank 0
                s.method.save(path, model, facts, final=not suffix)
        if main:
            config_io.save(cfg, path.with_suffix(".toml"))
        state = save_state(s, progress) if progress is not None else None
    except OSError as exc:
        full = disk_full(exc, path)
        if full is None:
            raise
        raise full from None
    if not main:
        return path
    out.log(f"Saved {path}" + (f" and the training state {state}" if state else ""))
    out.emit(Checkpoint(step=step, epoch=epoch, path=str(path),
                        state=str(state) if state else None))
    upload_save(cfg, path, state, final=not suffix, log=out.log)  # saving.huggingface_repo_id
    keep_last(cfg, suffix, epoch, step, out.log)  # saving.save_last_n_*: now that this is whole
    return path


def save_samples(s: Any, out: Any, step: int) -> None:
    """One image per sample prompt from the model being trained, announced as a Sample."""
    from trainer.run.sample_prompts import sample_prompts
    from trainer.run.sampling import make_samples

    specs = sample_prompts(s.cfg)
    if not specs:
        return
    with averaged_weights(s.optimizer), s.ema.applied():  # FSDP: on every process, in step
        paths = make_samples(s.model, s.cfg, step, s.accelerator)
    if not s.accelerator.is_main_process:
        return
    out.log(f"Sample images: {', '.join(str(p) for p in paths)}")
    out.emit(Sample(step=step, paths=tuple(str(p) for p in paths),
                    prompts=tuple(p.prompt for p in specs), controls=sample_controls(s, specs)))


def sample_controls(s: Any, specs: list[Any]) -> tuple[tuple[str, ...], ...]:
    """Each prompt's control images as its sample took them (``--ci``, as many as the family
    takes: trainer/run/sampling.py); () when none has one."""
    from trainer.families import spec as family_spec

    most = family_spec(s.model.version).controls.max
    controls = tuple(tuple(p.control_images[:most]) for p in specs)
    return controls if any(controls) else ()


def flat_hparams(cfg: TrainConfig) -> dict[str, Any]:
    """The config as flat ``section.key`` scalars, for the trackers (TensorBoard's hparams)."""
    out: dict[str, Any] = {}
    for key, value in config_io.to_dict(cfg).items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        for name, v in items:
            if isinstance(v, (int, float, str, bool)) and not (isinstance(v, float)
                                                               and math.isnan(v)):
                out[f"{key}.{name}".strip(".")] = v
    return out
