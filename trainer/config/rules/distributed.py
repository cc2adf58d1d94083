"""``training.distributed = "fsdp"``: what it cannot go with, refused when a config loads.

FSDP (trainer/run/fsdp.py) shards the weights that a full fine-tune trains; the optimizer then
steps on shards (DTensors). What each refusal rests on:

- **Modes.** LoRA, LyCORIS and textual inversion train a few megabytes of adapter next to a
  frozen base that every GPU needs whole for its forward pass anyway: DDP (the default) fits
  them, sharding the adapter would save nothing.
- **Optimizers.** Those that update each element from its own gradient and state run on shards
  as on whole tensors; a 2-process test (tests/test_fsdp.py) steps each of :data:`FSDP_OPTIMIZERS`
  and matches one process. bitsandbytes' 8-bit / paged kernels have no DTensor rule; Adafactor
  factors the second moment by rows and columns, and D-Adaptation / Prodigy flatten every
  tensor for their global step size: both fail on a shard (torch 2.13).
- **Compile** of a sharded module is not tested here.

One process is only known when the run starts (``--num-machines`` is a flag, not a setting):
trainer/run/fsdp.py refuses it there.
"""

from __future__ import annotations

from typing import Any

FSDP_OPTIMIZERS = ("AdamW", "Lion", "SGDNesterov", "AdamWScheduleFree", "RAdamScheduleFree",
                   "SGDScheduleFree")


def problems(cfg: Any) -> list[str]:
    """What training.distributed = 'fsdp' cannot work with, naming the setting."""
    tr, opt = cfg.training, cfg.optimizer
    if tr.distributed != "fsdp":
        return []
    field = "training.distributed = 'fsdp'"
    if cfg.mode != "dreambooth":
        return [f"{field} shards the weights of a full fine-tune (DreamBooth); in "
                f"{cfg.mode} mode the trained adapter is small and every GPU needs "
                f"the frozen base whole anyway: set training.distributed = 'ddp'"]
    if opt.optimizer_class or opt.optimizer_type not in FSDP_OPTIMIZERS:
        name = opt.optimizer_class or opt.optimizer_type
        return [f"{field} steps the optimizer on shards of the weights, which "
                f"optimizer {name!r} cannot (8-bit kernels, factored or global "
                f"statistics); set optimizer.optimizer_type to one of "
                f"{', '.join(FSDP_OPTIMIZERS)}, or use training.distributed = 'ddp'"]
    if tr.compile:
        return [f"training.compile with {field}: compiling a sharded UNet is not "
                f"supported here; turn compile off or use training.distributed = "
                f"'ddp'"]
    return []
