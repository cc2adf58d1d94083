"""The training loop end to end on the tiny model: it trains, stops, saves and refuses bad input."""

import pytest
import torch
from safetensors import safe_open
from train_helpers import eval_loss, one_image_dataset, preset_config, small_config

from trainer.events import Checkpoint, Control, Finished, ListSink, Sample, Started, Step
from trainer.run import step as step_module
from trainer.run.loop import run


def _fresh_pipeline(tiny_model_dir):
    from diffusers import DDPMScheduler, StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(tiny_model_dir, local_files_only=True)
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    return pipe


def test_default_preset_trains_to_the_end(tmp_path):
    sink = ListSink()
    result = run(preset_config(tmp_path), sink)
    assert result.status == "finished", result.error
    started = sink.of(Started)[0]
    # 6 images x 10 repeats = 60 samples; batch 2 -> 30 steps/epoch; 2 epochs -> 60 steps
    assert (started.num_images, started.num_repeated_images) == (6, 60)
    assert (started.steps_per_epoch, started.epochs, started.total_steps) == (30, 2, 60)
    assert sum(started.buckets.values()) == 60 and len(started.buckets) == 3
    steps = sink.of(Step)
    assert [s.step for s in steps] == list(range(1, 61))
    assert steps[-1].eta_s == 0 and steps[-1].it_per_s > 0
    out = tmp_path / "out" / "default-lora.safetensors"
    assert result.output_path == str(out) and out.is_file()
    assert (tmp_path / "out" / "default-lora.toml").is_file()  # the resolved config beside it
    with safe_open(out, "pt") as f:
        meta = f.metadata()
    assert meta["ss_steps"] == "60" and meta["ss_num_epochs"] == "2"
    assert sink.events[-1] == result


def test_overfitting_one_image_lowers_the_loss_of_the_saved_lora(tmp_path, tiny_model_dir,
                                                                 monkeypatch):
    from trainer.methods.lora import LoraMethod

    gen = torch.Generator().manual_seed(0)
    x, hidden = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 77, 32, generator=gen)
    trained_out = {}
    real_save = LoraMethod.save

    def save_and_probe(self, path, model, facts, final):  # the trained model's output
        with torch.no_grad():
            trained_out["unet"] = model.unet(x, torch.tensor([10, 500]), hidden).sample.clone()
        return real_save(self, path, model, facts, final)

    monkeypatch.setattr(LoraMethod, "save", save_and_probe)
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, training={"max_train_steps": 60},
                       optimizer={"learning_rate": 5e-3})
    result = run(cfg)
    assert result.status == "finished", result.error
    pipe = _fresh_pipeline(tiny_model_dir)
    image = data / "1_circle" / "circle.png"
    base = eval_loss(pipe, image, "a red circle")
    with torch.no_grad():
        base_out = pipe.unet(x, torch.tensor([10, 500]), hidden).sample
    pipe.load_lora_weights(result.output_path)
    with torch.no_grad():
        loaded_out = pipe.unet(x, torch.tensor([10, 500]), hidden).sample
    assert torch.allclose(loaded_out, trained_out["unet"], atol=1e-4)
    assert not torch.allclose(loaded_out, base_out, atol=1e-3)
    trained = eval_loss(pipe, image, "a red circle")
    assert trained < 0.8 * base, (base, trained)


def test_text_encoder_lora_is_trained_and_loads_in_diffusers(tmp_path, tiny_model_dir):
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, network={"train_text_encoder": True},
                       optimizer={"learning_rate": 1e-2})
    result = run(cfg)
    assert result.status == "finished", result.error
    with safe_open(result.output_path, "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("lora_te_text_model_encoder_layers_0_") for k in keys)
    pipe = _fresh_pipeline(tiny_model_dir)
    ids = pipe.tokenizer(["a red circle"], padding="max_length", max_length=77,
                         return_tensors="pt").input_ids
    with torch.no_grad():
        before = pipe.text_encoder(ids)[0]
        pipe.load_lora_weights(result.output_path)
        after = pipe.text_encoder(ids)[0]
    assert not torch.allclose(before, after, atol=1e-4)


def test_stop_ends_at_a_step_boundary_and_saves(tmp_path):
    control = Control()

    class StopAtThree(ListSink):
        def emit(self, event):
            super().emit(event)
            if isinstance(event, Step) and event.step == 3:
                control.request_stop()

    sink = StopAtThree()
    result = run(preset_config(tmp_path), sink, control)
    assert result.status == "stopped" and result.step == 3
    assert [s.step for s in sink.of(Step)] == [1, 2, 3]
    with safe_open(result.output_path, "pt") as f:
        assert f.metadata()["ss_steps"] == "3"


def test_a_failing_sink_does_not_kill_the_run(tmp_path):
    class Broken:
        def emit(self, event):
            raise RuntimeError("the UI went away")

    data = one_image_dataset(tmp_path / "data")
    assert run(small_config(tmp_path, data), Broken()).status == "finished"


def test_bad_data_fails_before_any_step(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    (data / "1_circle" / "broken.png").write_bytes(b"")
    (data / "1_circle" / "half.png").write_bytes(
        (data / "1_circle" / "circle.png").read_bytes()[:200])
    sink = ListSink()
    result = run(small_config(tmp_path, data), sink)
    assert result.status == "failed" and not sink.of(Step) and not sink.of(Started)
    assert "broken.png" in result.error and "half.png" in result.error
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.safetensors"))


@pytest.mark.parametrize("sections, field", [
    ({"training": {"mixed_precision": "fp16"}}, "mixed_precision"),
    ({"model": {"pretrained_model_name_or_path": "/nowhere/model"}},
     "model.pretrained_model_name_or_path"),
    ({"dataset": {"train_data_dir": "/nowhere/data"}}, "dataset.train_data_dir"),
    ({"optimizer": {"optimizer_args": {"no_such_arg": 1}}}, "no_such_arg"),
])
def test_bad_settings_fail_with_a_message_naming_them(tmp_path, sections, field):
    data = one_image_dataset(tmp_path / "data")
    sink = ListSink()
    result = run(small_config(tmp_path, data, **sections), sink)
    assert result.status == "failed" and field in result.error
    assert not sink.of(Step)


def test_an_unknown_mode_is_refused_by_the_method_registry():
    from trainer.config import TrainConfig
    from trainer.methods import MethodUnavailable, get_method

    with pytest.raises(MethodUnavailable, match="not a training mode"):
        get_method(TrainConfig.model_construct(mode="hypernetwork"))


def test_second_run_encodes_nothing_and_a_new_resolution_reencodes(tmp_path, monkeypatch):
    calls = []
    real = step_module.encode_images

    def counting(vae, pixels, *family):
        calls.append(pixels.shape[0])
        return real(vae, pixels, *family)

    monkeypatch.setattr("trainer.run.caches.encode_images", counting)
    data = one_image_dataset(tmp_path / "data", size=(128, 128))
    disk = {"cache_latents_to_disk": True, "resolution": 64}
    encoded = []
    for _ in range(2):
        calls.clear()
        assert run(small_config(tmp_path, data, dataset=disk,
                                training={"max_train_steps": 1})).status == "finished"
        encoded.append(sum(calls))
    assert encoded == [1, 0]
    calls.clear()
    run(small_config(tmp_path, data, dataset={**disk, "resolution": 128},
                     training={"max_train_steps": 1}))
    assert sum(calls) == 1


def test_a_cpu_run_encodes_as_its_first_epoch_goes(tmp_path, monkeypatch):
    """On the CPU the caches fill as the first epoch reaches each image and caption
    (trainer/run/caches.py): a run of one step on four images encodes one image and one
    caption, not all four before its first step."""
    import trainer.run.caches as caches

    images, captions = [], []
    real_images, real_captions = caches.encode_images, caches.encode_captions
    monkeypatch.setattr(caches, "encode_images",
                        lambda vae, px, *family: images.append(px.shape[0]) or
                        real_images(vae, px, *family))
    monkeypatch.setattr(caches, "encode_captions",
                        lambda m, caps, skip: captions.append(len(caps)) or
                        real_captions(m, caps, skip))
    data = one_image_dataset(tmp_path / "data")
    folder = next(data.iterdir())
    for name in ("b", "c", "d"):  # four images with four captions
        (folder / f"{name}.png").write_bytes((folder / "circle.png").read_bytes())
        (folder / f"{name}.txt").write_text(f"a {name} circle")
    sink = ListSink()
    assert run(small_config(tmp_path, data, training={"max_train_steps": 1}),
               sink).status == "finished"
    assert images == [1] and captions == [1]
    logs = [e.message for e in sink.events if hasattr(e, "message")]
    assert any(m.startswith("Latent cache: 4 image(s) to encode") for m in logs)


def test_checkpoints_samples_and_tensorboard_logs(tmp_path):
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, training={"max_train_steps": 4, "log_with": "tensorboard"},
                       saving={"save_every_n_steps": 2, "output_name": "run"},
                       sampling={"sample_prompts": ["a red circle"], "sample_every_n_steps": 4,
                                 "sample_steps": 2})
    sink = ListSink()
    assert run(cfg, sink).status == "finished"
    out = tmp_path / "out"
    assert (out / "run-step00000002.safetensors").is_file() and (out / "run.safetensors").is_file()
    assert [c.step for c in sink.of(Checkpoint)] == [2, 4]
    sample = sink.of(Sample)[0]
    assert sample.step == 4 and all(p.endswith(".png") for p in sample.paths)
    assert list((out / "logs").rglob("events.out.tfevents.*"))
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*tmp"))
    assert isinstance(sink.events[-1], Finished)


@pytest.mark.parametrize("optimizer", ["AdamW8bit", "Lion", "Lion8bit", "Adafactor", "Prodigy"])
def test_each_optimizer_trains(tmp_path, optimizer):
    data = one_image_dataset(tmp_path / "data")
    lr = 1.0 if optimizer == "Prodigy" else 1e-3
    result = run(small_config(tmp_path, data, optimizer={"optimizer_type": optimizer,
                                                         "learning_rate": lr,
                                                         "lr_scheduler": "cosine",
                                                         "lr_warmup_steps": 1}))
    assert result.status == "finished", result.error


def test_training_options_together(tmp_path):
    """v-prediction, min-SNR, noise offset, accumulation, checkpointing, flip, conv LoRA,
    text-encoder output cache and a regularization folder in one run."""
    data = one_image_dataset(tmp_path / "data")
    reg = one_image_dataset(tmp_path / "reg", caption="a circle")
    cfg = small_config(
        tmp_path, data,
        model={"prediction_type": "v_prediction", "clip_skip": 2},
        dataset={"flip_aug": True, "cache_text_encoder_outputs": True,
                 "reg_data_dir": str(reg)},
        network={"conv_dim": 4, "conv_alpha": 2.0},
        training={"min_snr_gamma": 5.0, "noise_offset": 0.05, "max_train_steps": 2,
                  "gradient_accumulation_steps": 2, "gradient_checkpointing": True,
                  "prior_loss_weight": 0.5},
        optimizer={"max_grad_norm": 0.0, "lr_scheduler": "cosine_with_restarts"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    started = sink.of(Started)[0]
    # 1 image + 1 reg sample per epoch, batch 1, accumulation 2 -> 1 optimizer step per epoch
    assert started.num_repeated_images == 2 and started.steps_per_epoch == 1
    with safe_open(result.output_path, "pt") as f:
        meta, keys = f.metadata(), list(f.keys())
    assert any("resnets_0_conv1.lora_down" in k for k in keys)
    assert meta["ss_min_snr_gamma"] == "5.0" and meta["ss_v2"] == "False"
    assert meta["modelspec.prediction_type"] == "v"


def test_stop_during_preparation_ends_without_training(tmp_path):
    control = Control()

    class StopOnFirstLog(ListSink):
        def emit(self, event):
            super().emit(event)
            control.request_stop()  # pressed while the data and the model are being prepared

    sink = StopOnFirstLog()
    result = run(preset_config(tmp_path), sink, control)
    assert result.status == "stopped" and result.step == 0 and result.output_path is None
    assert not sink.of(Step) and not sink.of(Started)
