"""training.distributed = "fsdp" (trainer/run/fsdp.py): DreamBooth's trained networks fully
sharded over 2 gloo processes on the CPU. What it refuses, how the networks are cut into units,
the optimizers that step on shards, and real runs of the tiny model through torchrun: the same
weights as one process with the global batch, the same files, and an exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from train_helpers import small_config

from trainer.config.rules.distributed import FSDP_OPTIMIZERS
from trainer.events import Checkpoint, ListSink, Sample, Step, Validation
from trainer.run.fsdp import units
from trainer.run.launch import end_process, run_launched
from trainer.run.loop import run


def images(folder: Path, colors) -> Path:
    folder.mkdir(parents=True)
    for i, color in enumerate(colors):
        Image.new("RGB", (64, 64), color).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a shape number {i}")
    return folder.parent


def dreambooth(tmp_path: Path, name: str, **sections):
    data = images(tmp_path / name / "data" / "1_shapes", [(220, 30, 30), (30, 60, 200)])
    return small_config(tmp_path / name, data, mode="dreambooth", **sections)


# -- what it refuses ----------------------------------------------------------------------------
def test_fsdp_is_dreambooth_only_with_optimizers_that_step_on_shards(tmp_path):
    data = images(tmp_path / "data" / "1_x", [(1, 2, 3)])
    fsdp = {"distributed": "fsdp", "num_processes": 2}
    assert small_config(tmp_path, data, mode="dreambooth").training.distributed == "ddp"
    assert small_config(tmp_path, data, mode="dreambooth", training=fsdp)
    for mode in ("lora", "textual_inversion"):
        with pytest.raises(ValueError, match=r"training.distributed = 'fsdp'.*set "
                                             r"training.distributed = 'ddp'"):
            small_config(tmp_path, data, mode=mode, training=fsdp,
                         network={"token_string": "<tok>"})
    for name in ("AdamW8bit", "Adafactor", "Prodigy"):
        with pytest.raises(ValueError, match=f"optimizer {name!r} cannot.*AdamW, Lion"):
            small_config(tmp_path, data, mode="dreambooth", training=fsdp,
                         optimizer={"optimizer_type": name, "lr_scheduler": "constant"})
    with pytest.raises(ValueError, match="training.compile with training.distributed"):
        small_config(tmp_path, data, mode="dreambooth", training={**fsdp, "compile": True})


def test_one_process_is_refused_when_the_run_starts(tmp_path):
    result = run(dreambooth(tmp_path, "one", training={"distributed": "fsdp"}))
    assert result.status == "failed" and result.step == 0
    assert "training.distributed = 'fsdp'" in result.error
    assert "training.num_processes" in result.error


def test_each_block_is_a_unit_of_its_own():
    from trainer.families.sd.tiny import build_components

    parts = build_components()
    unet, encoder = parts["unet"], parts["text_encoder"]
    assert units(unet) == [*unet.down_blocks, *unet.up_blocks, unet.mid_block]
    assert units(encoder) == list(encoder.encoder.layers)  # CLIP: its transformer layers
    from trainer.families.common.tiny_mmdit import build_flux_components

    flux = build_flux_components()
    transformer, t5 = flux["transformer"], flux["text_encoder_2"]
    assert units(transformer) == [*transformer.transformer_blocks,
                                  *transformer.single_transformer_blocks]
    assert units(t5) == list(t5.encoder.block)


# -- the optimizers on shards: 2 gloo processes against one ---------------------------------
def _steps(name: str, rank: int, world: int) -> torch.Tensor:
    """Three steps of a small 2-layer net (uneven rows: 7 of them over 2 processes)."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import fully_shard

    from trainer.optim.optimizers import make_optimizer

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(),
                              torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.Linear(7, 3)))
    if world > 1:
        fully_shard(net[2])
        fully_shard(net)
    section = SimpleNamespace(optimizer_class=None, optimizer_type=name, weight_decay=0.01,
                              optimizer_args={}, learning_rate=1e-2, lr_warmup_steps=0,
                              lr_scheduler="constant")
    optimizer = make_optimizer(section, [{"params": list(net.parameters())}], "cpu")
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        rows = x[rank * 2:rank * 2 + 2] if world > 1 else x
        net(rows).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(list(net.parameters()), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in net.parameters()]
    return torch.cat([w.detach().reshape(-1) for w in whole])


def _worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    # a file store: no port to pick that a test running beside this one could take first
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        got = {name: _steps(name, rank, 2) for name in FSDP_OPTIMIZERS}
        if rank == 0:
            torch.save(got, out)
        dist.barrier()  # leave together, as a launched rank does (launch._leave)
    finally:
        dist.destroy_process_group()
    end_process(0)  # as a launched rank ends: without the finalization that aborted 1 in 15


def test_the_allowed_optimizers_step_on_shards_as_on_whole_tensors(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "sharded.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    sharded = torch.load(out)
    for name in FSDP_OPTIMIZERS:
        assert torch.allclose(sharded[name], _steps(name, 0, 1), atol=1e-6), name


def test_a_rank_ends_without_finalization_keeping_its_output_and_exit_code(tmp_path):
    """end_process: what was printed reaches the pipe, the code is the process's, and nothing
    of Python's finalization runs (an atexit handler stands for it: the gloo threads' abort
    happened there)."""
    import subprocess
    import sys

    marker = tmp_path / "finalized"
    code = ("import atexit, pathlib\n"
            "from trainer.run.launch import end_process\n"
            f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'ran')\n"
            "print('rank 0 done', end='')\n"
            "end_process(7)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=120)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "rank 0 done"
    assert not marker.exists()


# -- real runs: torchrun, gloo; two launches and one in-process run ---------------------------
def _updates(trained: dict, other: dict, base: dict) -> float:
    """|trained - other| / |trained - base| over every tensor: how far two runs' updates
    differ, relative to the update."""
    diff = sum((trained[k] - other[k]).double().pow(2).sum() for k in trained)
    update = sum((trained[k] - base[k]).double().pow(2).sum() for k in trained)
    return float((diff / update).sqrt())


def test_fsdp_trains_what_one_process_trains_saves_the_same_files_and_resumes_exactly(
        tmp_path, tiny_model_dir):
    """2 processes x batch 1, UNet and text encoder sharded (gradient checkpointing, EMA, a
    sample and the validation loss on every process, an intermediate save with the state), as
    1 process x batch 2 in-process; then the state at step 2 resumes to the same step 3."""
    val = images(tmp_path / "val" / "1_val", [(30, 200, 30)])
    sections = dict(
        training={"num_processes": 2, "train_batch_size": 1, "max_train_steps": 3,
                  "distributed": "fsdp", "mixed_precision": "no", "ema_decay": 0.5,
                  "gradient_checkpointing": True, "validate_every_n_steps": 2},
        network={"train_text_encoder": True},
        dataset={"validation_data_dir": str(val)},
        sampling={"sample_prompts": ["a shape"], "sample_every_n_steps": 2, "sample_steps": 2},
        saving={"save_state": True, "save_every_n_steps": 2})
    cfg = dreambooth(tmp_path, "fsdp", **sections)
    sink = ListSink()
    sharded = run_launched(cfg, sink)
    assert sharded.status == "finished" and sharded.step == 3, sharded.error
    assert [e.step for e in sink.of(Step)] == [1, 2, 3]
    assert [e.step for e in sink.of(Sample)] == [2]
    assert [e.step for e in sink.of(Validation)] == [2, 3]
    out = tmp_path / "fsdp" / "out"
    state = Path(sink.of(Checkpoint)[0].state)
    assert sorted(p.name for p in (out / "sample").iterdir()) == ["default-lora_000002_00.png"]

    one_cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={
        "num_processes": 1, "train_batch_size": 2, "distributed": "ddp"})})
    one_cfg = one_cfg.model_copy(update={"saving": cfg.saving.model_copy(update={
        "output_dir": str(tmp_path / "one")})})
    one = run(one_cfg)
    assert one.status == "finished", one.error
    folder = Path(sharded.output_path).with_suffix("")
    one_folder = Path(one.output_path).with_suffix("")
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(one_folder)) for p in one_folder.rglob("*")
                           if p.is_file())
    for part in ("unet/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"):
        a, b = load_file(one_folder / part), load_file(folder / part)
        base = load_file(Path(tiny_model_dir) / part)
        assert a.keys() == b.keys() and all(a[k].shape == b[k].shape and a[k].dtype ==
                                             b[k].dtype for k in a), part
        assert _updates(a, b, base) < 1e-3, part  # float rounding (measured: ~1e-4)
    a, b = load_file(one.output_path), load_file(sharded.output_path)
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    trained = load_file(state / "trained.safetensors")  # whole tensors, the DDP layout
    assert trained["unet.conv_in.weight"].shape == load_file(
        one_folder / "unet/diffusion_pytorch_model.safetensors")["conv_in.weight"].shape

    uninterrupted = load_file(sharded.output_path)
    losses = [e.loss for e in sink.of(Step)]
    resumed_cfg = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"resume": str(state)})})
    sink = ListSink()
    resumed = run_launched(resumed_cfg, sink)
    assert resumed.status == "finished" and resumed.step == 3, resumed.error
    assert [e.loss for e in sink.of(Step)] == losses[2:]
    again = load_file(resumed.output_path)
    assert all(torch.equal(again[k], uninterrupted[k]) for k in uninterrupted)
