"""The run on the families' contract: the family and the objective are resolved once per run,
the family gets its guidance when it is built, the loop talks through a Reporter and keeps its
place in one Progress, and a UNet family's LoRA names come from its own lora role."""

from types import SimpleNamespace

import pytest
import torch
from train_helpers import one_image_dataset, small_config

from trainer.events import Control, ListSink, Log
from trainer.families import family, role
from trainer.models.text_conditioning import TextConditioning
from trainer.run import step as step_module
from trainer.run.reporter import Reporter, StoppedBeforeTraining
from trainer.run.state import Progress


def test_a_run_resolves_its_family_and_objective_once(tmp_path, monkeypatch):
    counts = {"family": 0, "objective": 0}
    real_family, real_objective = step_module.run_family, step_module.objective_for

    def counted(name, real):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(step_module, "run_family", counted("family", real_family))
    monkeypatch.setattr(step_module, "objective_for", counted("objective", real_objective))
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       training={"max_train_steps": 4, "mixed_precision": "no"})
    from trainer.run.loop import run

    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    assert counts == {"family": 1, "objective": 1}  # not once per step


class _Transformer(torch.nn.Module):
    """Records the guidance FLUX.1's predict passes; returns the packed input."""

    config = SimpleNamespace(guidance_embeds=True)

    def forward(self, hidden_states, guidance=None, **_):
        self.seen = guidance
        return (hidden_states,)


def test_flux_reads_the_guidance_it_was_built_with():
    transformer = _Transformer()
    model = SimpleNamespace(denoiser=transformer)
    noisy, t = torch.zeros(1, 16, 4, 4), torch.tensor([0.5])
    text = TextConditioning(torch.zeros(1, 3, 8), torch.zeros(1, 8))
    cfg = SimpleNamespace(flow=SimpleNamespace(guidance_scale=7.0))
    out = family("flux1", guidance=2.5).predict(model, noisy, t, text, None, cfg)
    assert out.shape == noisy.shape and transformer.seen.tolist() == [2.5]
    family("flux1").predict(model, noisy, t, text, None, cfg)  # built without one: the config's
    assert transformer.seen.tolist() == [7.0]
    assert family("sd1", guidance=2.5).guidance is None  # the SD families take none


def test_the_reporter_logs_emits_and_stops():
    sink, control = ListSink(), Control()
    out = Reporter(sink, control)
    out.log("hello", "warning")
    assert sink.of(Log)[0].message == "hello" and sink.of(Log)[0].level == "warning"
    out.check_stop()
    control.request_stop()
    with pytest.raises(StoppedBeforeTraining):
        out.check_stop()


@pytest.mark.parametrize("done, saved", [(False, (7, 2, 3)), (True, (7, 3, 0))])
def test_progress_saves_the_next_epoch_after_a_whole_one(done, saved):
    at = Progress(step=7, epoch=2, position=3, sampled_at=5)
    state = at.to_save(done, micro_step=1, losses=[0.5])
    assert (state.step, state.epoch, state.position) == saved
    assert (state.micro_step, state.losses, state.sampled_at) == (1, [0.5], 5)


@pytest.mark.parametrize("name, prefixes, sgm, version", [
    ("sd1", {"text_encoder": "lora_te"}, False, "sd_v1"),
    ("sd2", {"text_encoder": "lora_te"}, False, "sd_v2"),
    ("sdxl", {"text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}, True,
     "sdxl_base_v1-0"),
])
def test_a_unet_family_names_its_lora_in_its_own_folder(name, prefixes, sgm, version):
    from trainer.export.metadata import lora_naming, naming_family

    naming = role(name, "lora")
    assert lora_naming(name) is naming and naming_family(name) == name
    assert (naming.TE_PREFIXES, naming.SGM_LAYOUT) == (prefixes, sgm)
    assert naming.base_model_version(name, False) == version


def test_a_family_without_unet_lora_names_falls_back_to_sd1s():
    from trainer.export.metadata import lora_naming, naming_family

    for name in ("auto", "flux1", "sd3"):
        assert naming_family(name) == "sd1" and lora_naming(name) is role("sd1", "lora")
