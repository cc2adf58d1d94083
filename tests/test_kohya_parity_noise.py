"""Issue 21: sd-scripts' input-perturbation noise (Ning et al. 2023) and v-prediction-like loss,
derived by hand from the noise schedule, imported from kohya_ss and trained for 2 steps."""

from __future__ import annotations

import pytest
import torch
from train_helpers import one_image_dataset, small_config

from trainer.config import TrainConfig
from trainer.importers.kohya import import_kohya
from trainer.objectives.ddpm import DDPMObjective
from trainer.run.loop import run


def _objective(**training):
    import diffusers

    sched = diffusers.DDPMScheduler(num_train_timesteps=1000)
    return DDPMObjective(TrainConfig.model_validate({"training": training}).training, sched,
                         "epsilon"), sched


def test_input_perturbation_noises_the_input_but_not_the_target():
    obj, sched = _objective(ip_noise_gamma=0.1)
    latents, noise = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    t = torch.tensor([10, 700])
    torch.manual_seed(3)
    noisy = obj.noisy(latents, noise, t)
    torch.manual_seed(3)
    xi = torch.randn_like(noise)
    a = sched.alphas_cumprod[t].view(-1, 1, 1, 1)
    assert torch.allclose(noisy, a.sqrt() * latents + (1 - a).sqrt() * (noise + 0.1 * xi),
                          atol=1e-6)
    assert torch.equal(obj.target(latents, noise, t), noise)
    obj, _ = _objective(ip_noise_gamma=0.1, ip_noise_gamma_random_strength=True)
    torch.manual_seed(4)
    noisy = obj.noisy(latents, noise, t)
    torch.manual_seed(4)
    strength = torch.rand(1) * 0.1
    expected = a.sqrt() * latents + (1 - a).sqrt() * (noise + strength * torch.randn_like(noise))
    assert torch.allclose(noisy, expected, atol=1e-6)


def test_v_pred_like_loss_weights_each_image_as_sd_scripts_adds_it():
    obj, sched = _objective(v_pred_like_loss=0.5)
    t = torch.tensor([0, 500, 999])
    a = sched.alphas_cumprod[t].double()
    snr = torch.clamp(a / (1 - a), max=1000)
    scale = snr / (snr + 1)
    loss = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    expected = loss + loss / scale * 0.5  # sd-scripts' add_v_prediction_like_loss
    got = loss * obj.weights(torch.ones(3), t).double()
    assert torch.allclose(got, expected, rtol=1e-5)


def test_imported_and_trained_for_two_steps(tmp_path):
    cfg, report = import_kohya({"LoRA_type": "Standard", "ip_noise_gamma": 0.1,
                                "ip_noise_gamma_random_strength": True,
                                "v_pred_like_loss": "0.2"})
    assert not report.unsupported
    tr = cfg.training
    assert (tr.ip_noise_gamma, tr.ip_noise_gamma_random_strength, tr.v_pred_like_loss) == \
        (0.1, True, 0.2)
    data = one_image_dataset(tmp_path / "data")
    result = run(small_config(tmp_path, data, training={
        "max_train_steps": 2, "ip_noise_gamma": 0.1, "v_pred_like_loss": 0.2}))
    assert result.status == "finished", result.error
    assert result.step == 2


@pytest.mark.parametrize("value", [0, "0", ""])
def test_zero_means_off_in_kohya_files(value):
    cfg, report = import_kohya({"LoRA_type": "Standard", "ip_noise_gamma": value})
    assert cfg.training.ip_noise_gamma is None and "ip_noise_gamma" in report.unset
