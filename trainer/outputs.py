"""What the loop knows about a run, gathered for the metadata of each saved file."""

from __future__ import annotations

from typing import Any

from trainer.config import TrainConfig
from trainer.plan import StepPlan


def run_facts(cfg: TrainConfig, model: Any, data: Any, plan: StepPlan, epoch: int, step: int,
              started_at: float, precision: str, optimizer: Any = None):
    """A :class:`~trainer.export.metadata.RunFacts` for a save at ``step``/``epoch``."""
    from trainer.export.metadata import RunFacts

    train = [c for c, e in zip(data.counts, data.entries) if not e.is_reg]
    reg = [c for c, e in zip(data.counts, data.entries) if e.is_reg]
    buckets = {i: {"resolution": tuple(int(x) for x in name.split("x")), "count": count}
               for i, (name, count) in enumerate(data.bucket_table().items())}
    opt_name = None
    if optimizer is not None:
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
        opt_name = f"{type(inner).__module__}.{type(inner).__name__}"
    return RunFacts(
        steps=step, epoch=epoch, max_train_steps=plan.total_steps, num_epochs=plan.epochs,
        num_batches_per_epoch=plan.batches_per_epoch, num_train_images=sum(train),
        num_reg_images=sum(reg), dataset_dirs=data.dataset_dirs(),
        tag_frequency=data.tag_frequency(), bucket_info={"buckets": buckets},
        training_started_at=started_at, base_model_version=model.version,
        prediction_type=model.prediction_type, mixed_precision=precision,
        optimizer=opt_name,
    )
