"""v-prediction and zero terminal SNR on the tiny model: the schedule trains and samples."""

import torch
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink, Step
from trainer.run.loop import run


def test_zero_terminal_snr_v_prediction_trains_and_samples_on_the_same_schedule(
        tmp_path, monkeypatch):
    from trainer.run import sampling

    seen = {}
    real = sampling.inference_pipeline

    def spy(model, cfg, unet=None):
        pipe = real(model, cfg, unet)
        seen["training"] = model.noise_scheduler
        seen["sampler"] = pipe.scheduler
        return pipe

    monkeypatch.setattr(sampling, "inference_pipeline", spy)
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, model={"prediction_type": "v_prediction"},
                       training={"zero_terminal_snr": True, "min_snr_gamma": 5.0,
                                 "max_train_steps": 3},
                       sampling={"sample_prompts": ["a red circle"], "sample_every_n_steps": 3,
                                 "sample_steps": 2})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert all(torch.isfinite(torch.tensor(e.loss)) for e in sink.of(Step))
    assert seen["training"].alphas_cumprod[-1].item() == 0.0  # the last step is pure noise
    assert seen["sampler"].config.rescale_betas_zero_snr
    assert seen["sampler"].config.timestep_spacing == "trailing"


def test_without_the_option_the_model_schedule_is_kept(tmp_path, monkeypatch):
    from trainer.run import sampling

    seen = {}
    real = sampling.inference_pipeline
    monkeypatch.setattr(sampling, "inference_pipeline",
                        lambda model, cfg, unet=None: seen.setdefault(
                            "s", model.noise_scheduler) and real(model, cfg, unet))
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, training={"max_train_steps": 1},
                       sampling={"sample_prompts": ["a red circle"], "sample_every_n_steps": 1,
                                 "sample_steps": 2})
    assert run(cfg).status == "finished"
    assert seen["s"].alphas_cumprod[-1].item() > 0.0
