"""Validation loss: a deterministic held-out split (or a folder) that is never trained on, the
loss at fixed timesteps and noise every N steps (a Validation event, a log line, TensorBoard's
val_loss), the run unchanged by it, and the GUI's state and chart folding it in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gui_helpers import one_torch_thread  # noqa: F401
from train_helpers import preset_config

from trainer.data import DatasetError, prepare_dataset
from trainer.data.discover import ConceptFolder, ImageEntry
from trainer.data.split import held_out_count, split_entries
from trainer.events import ListSink, Started, Step, Validation
from trainer.run.loop import run


def entry(name: str, folder: str = "10_a", is_reg: bool = False) -> ImageEntry:
    f = ConceptFolder(Path("/data") / folder, 10, "a")
    return ImageEntry(f.path / f"{name}.png", "a", f, is_reg, (64, 64), name)


def test_the_split_is_seeded_by_name_not_by_position():
    images = [entry(f"img{i:02d}") for i in range(20)] + [entry("reg", "1_b", is_reg=True)]
    trained, held = split_entries(images, 0.2, seed=42)
    assert len(held) == held_out_count(20, 0.2) == 4
    assert not any(e.is_reg for e in held) and any(e.is_reg for e in trained)
    assert {e.path for e in trained} | {e.path for e in held} == {e.path for e in images}
    assert not {e.path for e in trained} & {e.path for e in held}
    again = split_entries(list(reversed(images)), 0.2, seed=42)[1]
    assert {e.path for e in again} == {e.path for e in held}  # the order does not matter
    other_seed = split_entries(images, 0.2, seed=7)[1]
    assert {e.path for e in other_seed} != {e.path for e in held}
    grown = split_entries(images + [entry("img99")], 0.2, seed=42)[1]  # still 4 held out
    assert len({e.path for e in grown} ^ {e.path for e in held}) <= 2  # one in, one out at most
    assert len(split_entries(images[:3], 0.01, seed=1)[1]) == 1  # at least one


def test_prepare_dataset_holds_the_images_out_of_training(tmp_path):
    cfg = preset_config(tmp_path, dataset={"validation_split": 0.34})
    data = prepare_dataset(cfg, warn=print)
    assert len(data.held_out) == 2 and data.num_images == 4  # of the sample dataset's 6
    assert not {e.path for e in data.held_out} & {e.path for e in data.entries}
    again = prepare_dataset(cfg, warn=print)
    assert [e.path for e in again.held_out] == [e.path for e in data.held_out]
    folder = tmp_path / "val"
    shutil.copytree(data.held_out[0].folder.path, folder / "1_shapes")
    cfg = preset_config(tmp_path, dataset={"validation_data_dir": str(folder)})
    data = prepare_dataset(cfg, warn=print)
    assert data.num_images == 6 and len(data.held_out) == 6  # a folder: nothing held out
    both = preset_config(tmp_path, dataset={"validation_data_dir": str(folder),
                                            "validation_split": 0.2})
    with pytest.raises(DatasetError, match="validation_split and dataset.validation_data_dir"):
        prepare_dataset(both, warn=print)
    everything = preset_config(tmp_path, dataset={"validation_split": 0.5,
                                                  "train_data_dir": str(folder)})
    data = prepare_dataset(everything, warn=print)
    assert data.num_images == 3 and len(data.held_out) == 3


def test_a_run_reports_validation_every_n_steps_and_to_tensorboard(tmp_path,
                                                                   one_torch_thread):  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = preset_config(tmp_path, dataset={"validation_split": 0.2},
                        training={"max_train_steps": 10, "validate_every_n_steps": 4,
                                  "log_with": "tensorboard"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert sink.of(Started)[0].num_images == 5  # one of six held out
    found = sink.of(Validation)
    assert [v.step for v in found] == [4, 8, 10] and all(v.images == 1 for v in found)
    assert all(0 < v.loss < 10 for v in found)
    order = [type(e).__name__ for e in sink.events if isinstance(e, (Step, Validation))]
    assert order[order.index("Validation") - 1] == "Step"  # right after its step
    logs = list((tmp_path / "out" / "logs").rglob("events.out.tfevents.*"))
    scalars = EventAccumulator(str(logs[0].parent)).Reload().Scalars("val_loss")
    assert [s.step for s in scalars] == [4, 8, 10]
    assert [s.value for s in scalars] == pytest.approx([v.loss for v in found])


def test_validation_is_fixed_and_leaves_the_run_as_it_was(tmp_path, tiny_model_dir,
                                                         one_torch_thread):  # noqa: F811
    from trainer.models.loader import load_base_model
    from trainer.run import validation

    base = preset_config(tmp_path / "a", training={"max_train_steps": 4})
    val_dir = tmp_path / "val" / "1_shapes"
    val_dir.mkdir(parents=True)
    data = prepare_dataset(base, warn=print)
    for e in data.entries[:2]:
        shutil.copy(e.path, val_dir / e.path.name)
    checked = preset_config(tmp_path / "b", training={"max_train_steps": 4,
                                                      "validate_every_n_steps": 2},
                            dataset={"validation_data_dir": str(val_dir.parent)})
    plain, with_val = ListSink(), ListSink()
    assert run(base, plain).status == run(checked, with_val).status == "finished"
    assert [s.loss for s in plain.of(Step)] == [s.loss for s in with_val.of(Step)]
    assert len(with_val.of(Validation)) == 2 and not plain.of(Validation)
    # the same model scores the same: fixed timesteps and noise, eval mode
    model = load_base_model(checked.model)
    vdata = prepare_dataset(checked, warn=print)
    vset = validation.build_set(vdata, model, checked)
    model.unet.train()
    first = validation.validation_loss(vset, model, checked, "cpu", torch.float32)
    second = validation.validation_loss(vset, model, checked, "cpu", torch.float32)
    assert first == second and model.unet.training  # train mode put back
    assert len(vset.items) == 2 and len(vset.timesteps) == len(validation.TIMESTEP_FRACTIONS)


def test_the_page_state_and_chart_show_validation_and_a_compared_run():
    from kohya_gui import progress
    from kohya_gui.job_state import JobState, curve

    class FakeJob:
        id, label = "job-1", "lora: x"
        cfg = preset_config(Path("/tmp"))

    state = JobState(FakeJob())
    for step in range(1, 5):
        state.apply(Step(step, 4, 1, 1.0 / step, 1.0, 1e-4, 1.0, 0.0))
    state.apply(Validation(4, 0.5, 2))
    snap = state.to_dict()
    assert snap["validation"] == [[4, 0.5]]
    assert "validation loss" in progress.progress_html({**snap, "status": "running"})
    history = {"job_id": "job-0", "label": "old", "status": "finished", **curve(state)}
    frame = progress.loss_frame(snap, history)
    counts = frame.dropna().groupby("series").size().to_dict()
    assert counts == {"raw": 4, "smoothed": 4, "validation": 1, "compared": 4,
                      "compared validation": 1}
    assert set(frame["series"]) == set(progress.SERIES)  # every series has its colour row
    snap["history"] = [history, {"job_id": "job-9", "label": "x", "status": "cancelled"}]
    assert progress.comparable_runs(snap) == [["job-0 (old, finished)", "job-0"]]
    assert progress.compared_run(snap, "job-0") is history
