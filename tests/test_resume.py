"""Save the training state and resume exactly: a resumed run is indistinguishable from one that
never stopped (the loss of every step and the final tensors, bit for bit, on the CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file
from train_helpers import preset_config

from trainer.events import Checkpoint, Control, ListSink, Step
from trainer.run.loop import run
from trainer.run.state import StateError, find_latest


def three_images(root: Path) -> Path:
    """3 images x 2 repeats: 6 batches an epoch at batch 1, so a stop lands mid-epoch."""
    folder = root / "2_shapes"
    folder.mkdir(parents=True)
    for i, color in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        img = Image.new("RGB", (64, 64), (240, 240, 240))
        ImageDraw.Draw(img).ellipse((8 + 4 * i, 8, 56, 56 - 4 * i), fill=color)
        img.save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"shape {i}, red")
    return root


def config(tmp_path: Path, out: str, mode: str = "lora", **sections):
    data = tmp_path / "data"
    if not data.exists():
        three_images(data)
    base = {"dataset": {"train_data_dir": str(data), "resolution": 64, "min_bucket_reso": 64,
                        "max_bucket_reso": 128, "bucket_reso_steps": 64},
            "training": {"max_train_steps": 12, "max_train_epochs": None,
                         "train_batch_size": 1},
            "saving": {"save_precision": "fp32", "save_state": True, "output_name": "run"},
            "optimizer": {"learning_rate": 1e-3, "weight_decay": 0.01}}
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    cfg = preset_config(tmp_path, mode, **base)
    return cfg.model_copy(update={"saving": cfg.saving.model_copy(
        update={"output_dir": str(tmp_path / out)})})


class StopAt(ListSink):
    def __init__(self, control: Control, step: int):
        super().__init__()
        self.control, self.at = control, step

    def emit(self, event):
        super().emit(event)
        if isinstance(event, Step) and event.step == self.at:
            self.control.request_stop()


def losses(sink) -> list[float]:
    return [e.loss for e in sink.of(Step)]


def stop_and_resume(cfg, stop_at: int):
    control = Control()
    first = StopAt(control, stop_at)
    assert run(cfg, first, control).status == "stopped"
    resumed = cfg.model_copy(update={"training": cfg.training.model_copy(
        update={"resume": "latest"})})
    second = ListSink()
    result = run(resumed, second)
    assert result.status == "finished", result.error
    return losses(first) + losses(second), result, second


CASES = {
    "lora": ("lora", {}),
    "lora-no-latent-cache": ("lora", {"dataset": {"cache_latents": False}}),
    "lora-ema": ("lora", {"training": {"ema_decay": 0.9}}),  # the saved file is the EMA's
    "lora-accumulation-2": ("lora", {"training": {"gradient_accumulation_steps": 2,
                                                  "max_train_steps": 6}}),
    "lora-text-encoder-stops": ("lora", {"network": {"train_text_encoder": True,
                                                     "stop_text_encoder_training": 3}}),
    "flux-lora": ("lora", {"model": {"pretrained_model_name_or_path": "embedded:tiny-flux"},
                           "network": {"train_text_encoder": True}}),
    "dreambooth": ("dreambooth", {}),
    "textual_inversion": ("textual_inversion", {
        "network": {"token_string": "<t>", "init_word": "shape",
                    "caption_templates": "object", "num_vectors_per_token": 2},
        "optimizer": {"learning_rate": 5e-2}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, case):
    mode, sections = CASES[case]
    straight_cfg = config(tmp_path, "straight", mode, **sections)
    straight = ListSink()
    result = run(straight_cfg, straight)
    assert result.status == "finished", result.error
    stop_at = straight_cfg.training.max_train_steps // 2 - 1  # mid-epoch
    both, resumed, sink = stop_and_resume(config(tmp_path, "resumed", mode, **sections),
                                          stop_at)
    assert both == losses(straight)  # every step's loss, bit for bit
    assert [e.step for e in sink.of(Step)][0] == stop_at + 1
    a, b = load_file(result.output_path), load_file(resumed.output_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_states_are_saved_with_every_save_and_latest_is_the_newest_complete(tmp_path):
    cfg = config(tmp_path, "out", saving={"save_every_n_steps": 4})
    sink = ListSink()
    assert run(cfg, sink).status == "finished"
    states = [c.state for c in sink.of(Checkpoint)]
    out = tmp_path / "out"
    assert states == [str(out / f"run-step{n:08d}-state") for n in (4, 8, 12)]
    (out / ".run-step00000099-state.abc.tmp").mkdir()  # a killed save: never offered
    assert find_latest(out) == out / "run-step00000012-state"
    for name in ("trained.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt",
                 "progress.json", "config.toml"):
        assert (out / "run-step00000004-state" / name).is_file(), name


def test_a_resume_may_change_saving_and_length_but_not_what_trains(tmp_path):
    cfg = config(tmp_path, "out", training={"max_train_steps": 4})
    assert run(cfg).status == "finished"
    longer = config(tmp_path, "out", training={"max_train_steps": 6, "resume": "latest"},
                    saving={"output_name": "longer", "save_every_n_steps": 5},
                    sampling={"sample_steps": 3})
    sink = ListSink()
    result = run(longer, sink)
    assert result.status == "finished", result.error
    assert [e.step for e in sink.of(Step)] == [5, 6]
    other = config(tmp_path, "out", training={"resume": "latest", "train_batch_size": 2},
                   network={"network_dim": 4}, dataset={"resolution": 128})
    result = run(other)
    assert result.status == "failed"
    for key in ("network.network_dim (8 -> 4)", "training.train_batch_size (1 -> 2)",
                "dataset.resolution (64 -> 128)"):
        assert key in result.error


def test_resume_latest_without_a_state_names_the_setting(tmp_path):
    cfg = config(tmp_path, "empty", training={"resume": "latest"})
    result = run(cfg)
    assert result.status == "failed" and "training.resume = 'latest'" in result.error
    with pytest.raises(StateError, match="not a complete training state"):
        from trainer.run.state import resolve_resume

        resolve_resume(config(tmp_path, "x", training={"resume": str(tmp_path)}))
