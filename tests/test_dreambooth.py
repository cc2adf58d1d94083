"""DreamBooth on the tiny model: what trains, what is saved, and how the ecosystem loads it."""

import pytest
import torch
from safetensors import safe_open
from train_helpers import one_image_dataset, small_config

from trainer.events import Checkpoint, ListSink, Started
from trainer.methods.dreambooth import DreamBoothMethod
from trainer.run.loop import run

GEN = torch.Generator().manual_seed(0)
X, HIDDEN = torch.randn(2, 4, 8, 8, generator=GEN), torch.randn(2, 77, 32, generator=GEN)
TIMESTEPS = torch.tensor([10, 500])


def unet_out(unet):
    with torch.no_grad():
        return unet(X, TIMESTEPS, HIDDEN).sample


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.fixture
def captured(monkeypatch):
    """The trained model's weights at each save (method.save), keyed by the file name."""
    saves = {}
    real = DreamBoothMethod.save

    def save(self, path, model, facts, final=True):
        saves[path.name] = {"unet": state(model.unet), "vae": state(model.vae),
                            "text_encoder": state(model.text_encoder)}
        return real(self, path, model, facts, final)

    monkeypatch.setattr(DreamBoothMethod, "save", save)
    return saves


def db_config(tmp_path, **sections):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    sections.setdefault("optimizer", {}).setdefault("learning_rate", 1e-3)
    sections.setdefault("saving", {}).setdefault("output_name", "last")
    return small_config(tmp_path, data, mode="dreambooth", **sections)


def assert_same(loaded, expected, what):
    got = loaded.state_dict()
    assert set(got) == set(expected), what
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), f"{what}: {key}"


def test_unet_training_saves_a_single_file_and_a_folder_that_diffusers_loads(
        tmp_path, tiny_model_dir, captured):
    from diffusers import StableDiffusionPipeline

    result = run(db_config(tmp_path))
    assert result.status == "finished", result.error
    out = tmp_path / "out"
    single, folder = out / "last.safetensors", out / "last"
    assert result.output_path == str(single) and (out / "last.toml").is_file()
    trained = captured["last.safetensors"]
    from_folder = StableDiffusionPipeline.from_pretrained(folder, local_files_only=True)
    from_file = StableDiffusionPipeline.from_single_file(str(single), config=str(folder),
                                                         local_files_only=True)
    for pipe in (from_folder, from_file):
        for name in ("unet", "vae", "text_encoder"):
            assert_same(getattr(pipe, name), trained[name], name)
    base = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    assert_same(from_file.text_encoder, state(base.text_encoder), "frozen text encoder")
    assert_same(from_file.vae, state(base.vae), "frozen vae")
    assert not torch.allclose(unet_out(from_file.unet), unet_out(base.unet), atol=1e-4)
    with safe_open(str(single), "pt") as f:
        meta = f.metadata()
        keys = list(f.keys())
    assert meta["modelspec.architecture"] == "stable-diffusion-v1"
    assert any(k.startswith("model.diffusion_model.") for k in keys)
    assert any(k.startswith("cond_stage_model.transformer.") for k in keys)


def test_text_encoder_trains_then_stops(tmp_path, tiny_model_dir, monkeypatch):
    seen = []
    real_after = DreamBoothMethod.after_step

    def after_step(self, model, step):
        note = real_after(self, model, step)
        seen.append(state(model.text_encoder))
        return note

    monkeypatch.setattr(DreamBoothMethod, "after_step", after_step)
    sink = ListSink()
    cfg = db_config(tmp_path, training={"max_train_steps": 4},
                    network={"train_text_encoder": True, "stop_text_encoder_training": 2})
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    from diffusers import StableDiffusionPipeline

    base = state(StableDiffusionPipeline.from_pretrained(
        tiny_model_dir, local_files_only=True).text_encoder)
    changed = [any(not torch.equal(s[k], base[k]) for k in base) for s in seen]
    assert changed == [True] * 4
    same_after_stop = [all(torch.equal(seen[1][k], s[k]) for k in base) for s in seen[1:]]
    assert same_after_stop == [True, True, True]
    assert any("Text encoder frozen after step 2" in getattr(e, "message", "")
               for e in sink.events)


def test_intermediate_saves_write_the_single_file_unless_folders_are_asked_for(tmp_path):
    cfg = db_config(tmp_path, training={"max_train_steps": 4},
                    saving={"save_every_n_steps": 2, "save_precision": "fp16"})
    sink = ListSink()
    assert run(cfg, sink).status == "finished"
    out = tmp_path / "out"
    assert [c.path for c in sink.of(Checkpoint)] == [str(out / "last-step00000002.safetensors"),
                                                      str(out / "last.safetensors")]
    assert not (out / "last-step00000002").exists()
    assert (out / "last" / "model_index.json").is_file()
    with safe_open(str(out / "last.safetensors"), "pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.float16
    again = db_config(tmp_path / "b", training={"max_train_steps": 2},
                      saving={"save_every_n_steps": 1, "intermediate_diffusers": True})
    assert run(again).status == "finished"
    assert (tmp_path / "b" / "out" / "last-step00000001" / "model_index.json").is_file()


@pytest.mark.parametrize("memory", [
    {"training": {"gradient_checkpointing": True}},
    {"optimizer": {"optimizer_type": "AdamW8bit"}},
    {"training": {"mixed_precision": "bf16", "full_bf16": True}},
], ids=["gradient_checkpointing", "adamw8bit", "full_bf16"])
def test_memory_saving_paths_train(tmp_path, memory):
    memory.setdefault("training", {})["max_train_steps"] = 2
    sink = ListSink()
    result = run(db_config(tmp_path, **memory), sink)
    assert result.status == "finished", result.error
    losses = [e.loss for e in sink.events if type(e).__name__ == "Step"]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_prior_preservation_generates_class_images_once(tmp_path):
    from trainer.events import Progress

    reg = tmp_path / "reg"
    cfg = db_config(tmp_path, dataset={"reg_data_dir": str(reg), "num_class_images": 2,
                                       "class_prompt": "a circle"},
                    training={"max_train_steps": 2, "prior_loss_weight": 0.5},
                    sampling={"sample_steps": 2})
    sink = ListSink()
    assert run(cfg, sink).status == "finished"
    images = sorted((reg / "1_a circle").glob("*.png"))
    assert [p.name for p in images] == ["class_00000.png", "class_00001.png"]
    assert (reg / "1_a circle" / "class_00000.txt").read_text().strip() == "a circle"
    assert [(e.done, e.total) for e in sink.of(Progress)] == [(1, 2), (2, 2)]
    started = sink.of(Started)[0]
    assert (started.num_images, started.num_repeated_images) == (3, 2)  # 1 train + 1 reg
    before = [p.read_bytes() for p in images]
    second = ListSink()
    assert run(cfg, second).status == "finished"
    assert second.of(Progress) == [] and [p.read_bytes() for p in images] == before
    (images[1]).unlink()
    third = ListSink()
    assert run(cfg, third).status == "finished"
    assert [(e.done, e.total) for e in third.of(Progress)] == [(1, 1)]
    assert images[1].read_bytes() == before[1]  # image i always comes from seed + i


def test_the_class_folder_and_prompt(tmp_path):
    from trainer.run.class_images import ClassImageError, class_folder, missing_class_images

    reg = tmp_path / "reg"
    (reg / "5_dog").mkdir(parents=True)
    cfg = db_config(tmp_path, dataset={"reg_data_dir": str(reg), "num_class_images": 3})
    assert class_folder(cfg) == (reg / "5_dog", "dog")
    one_image_dataset(tmp_path / "x")
    (tmp_path / "x" / "1_circle" / "circle.png").rename(reg / "5_dog" / "class_00001.png")
    folder, prompt, todo = missing_class_images(cfg)
    assert (folder, prompt, todo) == (reg / "5_dog", "dog", [0, 2])
    (reg / "2_cat").mkdir()
    with pytest.raises(ClassImageError, match="dataset.class_prompt"):
        class_folder(cfg)
    named = db_config(tmp_path, dataset={"reg_data_dir": str(reg), "num_class_images": 3,
                                         "class_prompt": "a photo of a/cat"})
    assert class_folder(named) == (reg / "1_a photo of a_cat", "a photo of a/cat")


def test_configs_that_cannot_work_are_refused(tmp_path):
    from trainer.config.files import ConfigError, from_dict

    with pytest.raises(ConfigError, match="nothing would train"):
        from_dict({"mode": "dreambooth", "network": {"train_unet": False}})
    with pytest.raises(ConfigError, match="nothing would train after that step"):
        from_dict({"mode": "dreambooth", "network": {"train_unet": False,
                   "train_text_encoder": True, "stop_text_encoder_training": 3}})
    with pytest.raises(ConfigError, match="dataset.reg_data_dir is not"):
        from_dict({"mode": "dreambooth", "dataset": {"num_class_images": 4}})
    with pytest.raises(ConfigError, match="saving.output_name = 'sample'"):
        from_dict({"mode": "dreambooth", "saving": {"output_name": "sample"}})


def test_stop_while_class_images_are_generated_ends_the_run_cleanly(tmp_path):
    from trainer.events import Control, Progress

    control = Control()

    class StopOnProgress(ListSink):
        def emit(self, event):
            super().emit(event)
            if isinstance(event, Progress):
                control.request_stop()

    reg = tmp_path / "reg"
    cfg = db_config(tmp_path, dataset={"reg_data_dir": str(reg), "num_class_images": 3,
                                       "class_prompt": "a circle"},
                    sampling={"sample_steps": 2})
    sink = StopOnProgress()
    result = run(cfg, sink, control)
    assert result.status == "stopped" and sink.of(Started) == []
    assert len(list((reg / "1_a circle").glob("*.png"))) == 1  # what was made is kept
    assert not (tmp_path / "out" / "last.safetensors").exists()
