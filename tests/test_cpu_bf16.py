"""bf16 base weights on the CPU (issue 20): every network type and memory option trains a step
in bf16 (they stopped with "mixed dtype (CPU)" before), and ``auto`` picks bf16 only where the
probe measures it faster."""

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.families import FAMILIES
from trainer.run import cpu_precision
from trainer.run.loop import run
from trainer.system import cpu_bf16

# clip_skip 2 with a trained text encoder is what kohya_ss's "sd15 - EDG_LoHaOptiSettings" does:
# the norm after the skipped layer gets an fp32 input and had bf16 weights
CRASHED = {"model": {"clip_skip": 2}, "network": {"train_text_encoder": True}}


def _bf16_run(tmp_path, steps=1, **sections):
    data = one_image_dataset(tmp_path / "data")
    sections.setdefault("training", {}).update({"mixed_precision": "bf16",
                                                "max_train_steps": steps})
    result = run(small_config(tmp_path, data, **sections))
    assert result.status == "finished", result.error
    return result


@pytest.mark.parametrize("network_type", ["lora", "locon", "loha", "lokr", "ia3", "dora"])
def test_every_network_type_trains_in_bf16_on_the_cpu(tmp_path, network_type):
    network = dict(CRASHED["network"], network_type=network_type)
    result = _bf16_run(tmp_path, model=CRASHED["model"], network=network)
    tensors = load_file(result.output_path)
    assert tensors and all(torch.isfinite(t.float()).all() for t in tensors.values())


@pytest.mark.parametrize("validation", [False, True], ids=["train", "validation_loss"])
def test_textual_inversion_trains_in_bf16_on_the_cpu(tmp_path, validation):
    """The trained embedding is fp32 and the text encoder's output with it, while the frozen UNet
    is bf16 and, unlike an adapter's, runs without accelerate's autocast: the text reaches it at
    the UNet's dtype (it stopped at step 1 with 'expected m1 and m2 to have the same dtype')."""
    data = one_image_dataset(tmp_path / "data", caption="a photo of <cat>")
    sections = {"training": {"mixed_precision": "bf16", "max_train_steps": 2},
                "network": {"token_string": "<cat>", "init_word": "cat"}}
    if validation:
        sections["dataset"] = {"validation_data_dir": str(data)}
    result = run(small_config(tmp_path, data, mode="textual_inversion", **sections))
    assert result.status == "finished", result.error
    tensors = load_file(result.output_path)
    assert tensors and all(torch.isfinite(t.float()).all() for t in tensors.values())


@pytest.mark.parametrize("option", [
    {"training": {"gradient_checkpointing": True}},
    {"dataset": {"cache_latents": False}},
    {"dataset": {"cache_text_encoder_outputs": True}, "model": {"clip_skip": 2}},
], ids=["gradient_checkpointing", "no_latent_cache", "text_encoder_cache"])
def test_every_memory_option_trains_in_bf16_on_the_cpu(tmp_path, option):
    option = {k: dict(v) for k, v in option.items()}
    if "dataset" not in option or "cache_text_encoder_outputs" not in option["dataset"]:
        option.setdefault("model", {}).update(CRASHED["model"])
        option.setdefault("network", {}).update(CRASHED["network"])
    _bf16_run(tmp_path, **option)


def test_dreambooth_in_bf16_trains_the_loaded_fp32_weights_not_rounded_ones(tmp_path,
                                                                             monkeypatch):
    """What DreamBooth trains whole (the UNet, a trained text encoder) stays fp32 from the
    load on: it was cast to the compute dtype with the frozen modules and back, so a bf16 run
    started from weights rounded to bf16. The weights the optimizer gets are those loaded."""
    from trainer.models.loader import load_base_model
    from trainer.run import session

    seen = {}
    real_optimizer = session._optimizer

    def optimizer(s, groups):
        for name in ("unet", "text_encoder"):
            seen[name] = {k: v.detach().clone()
                          for k, v in getattr(s.model, name).state_dict().items()}
        return real_optimizer(s, groups)

    monkeypatch.setattr(session, "_optimizer", optimizer)
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, mode="dreambooth",
                       training={"mixed_precision": "bf16", "max_train_steps": 1},
                       network={"train_text_encoder": True})
    result = run(cfg)
    assert result.status == "finished", result.error
    loaded = load_base_model(cfg.model)
    for name in ("unet", "text_encoder"):
        for key, value in getattr(loaded, name).state_dict().items():
            assert seen[name][key].dtype == torch.float32, f"{name}: {key}"
            assert torch.equal(seen[name][key], value), f"{name}: {key}"


def test_a_bf16_norm_fed_fp32_fails_unless_kept_fp32():
    norm = torch.nn.LayerNorm(8).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="mixed dtype"):
        norm(torch.randn(2, 8))
    assert cpu_precision.keep_norms_fp32(torch.nn.Sequential(norm)) == 1
    assert norm(torch.randn(2, 8)).dtype == torch.float32
    assert norm(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_bf16_units_from_cpuinfo():
    amd = "processor: 0\nflags\t\t: fpu avx512f avx512_bf16 sse\n"
    intel = "flags : avx512_bf16 amx_tile amx_bf16\n"
    assert cpu_bf16.bf16_units(amd) == ("avx512_bf16",)
    assert cpu_bf16.bf16_units(intel) == ("amx_bf16", "avx512_bf16")
    assert cpu_bf16.bf16_units("Features\t: fp asimd bf16 sve\n") == ("bf16",)
    assert cpu_bf16.bf16_units("flags : fpu avx2\n") == ()


def _session(model, resolution=64):
    cfg = SimpleNamespace(training=SimpleNamespace(mixed_precision="auto"),
                          dataset=SimpleNamespace(resolution=resolution),
                          model=SimpleNamespace(clip_skip=1))
    return SimpleNamespace(cfg=cfg, device_info=SimpleNamespace(backend="cpu", name="Test CPU"),
                           model=model, precision="no", dtype=torch.float32)


class _Out:
    def __init__(self):
        self.lines = []

    def log(self, message, level="info"):
        self.lines.append(message)


@pytest.mark.parametrize("bf16_s, chosen", [(0.5, "bf16"), (0.95, "no"), (1.6, "no")])
def test_auto_picks_bf16_only_where_the_probe_finds_it_faster(monkeypatch, tmp_path, bf16_s,
                                                             chosen):
    monkeypatch.setenv(cpu_bf16.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cpu_bf16, "bf16_units", lambda: ("avx512_bf16",))
    probes = []
    monkeypatch.setattr(cpu_precision, "probe", lambda m, c: probes.append(1) or (1.0, bf16_s))
    monkeypatch.setattr(cpu_precision, "_others_cores", lambda before, after: 0.0)  # quiet
    model = SimpleNamespace(denoiser=torch.nn.Linear(4, 4))
    for _ in range(2):  # the second run reads the cached result and does not probe
        s, out = _session(model), _Out()
        cpu_precision.choose_cpu_precision(s, out)
        assert s.precision == chosen
        assert s.dtype == (torch.bfloat16 if chosen == "bf16" else torch.float32)
        assert "avx512_bf16" in out.lines[0] and "64 px" in out.lines[0]
    assert probes == [1]
    assert "cached" in out.lines[0]


def test_a_probe_that_other_processes_slowed_decides_its_run_but_is_not_kept(monkeypatch,
                                                                            tmp_path):
    monkeypatch.setenv(cpu_bf16.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cpu_bf16, "bf16_units", lambda: ("avx512_bf16",))
    probes = []
    monkeypatch.setattr(cpu_precision, "probe", lambda m, c: probes.append(1) or (1.0, 0.5))
    busy = [1.6]
    monkeypatch.setattr(cpu_precision, "_others_cores", lambda before, after: busy[0])
    model = SimpleNamespace(denoiser=torch.nn.Linear(4, 4))
    s, out = _session(model), _Out()
    cpu_precision.choose_cpu_precision(s, out)
    assert s.precision == "bf16" and "other processes using 1.6 cores, not kept" in out.lines[0]
    assert cpu_bf16.cached_results() == {}
    busy[0] = 0.1  # the next run, on a quiet machine, measures again and keeps it
    s, out = _session(model), _Out()
    cpu_precision.choose_cpu_precision(s, out)
    assert probes == [1, 1] and "measured: bf16 2.00x faster" in out.lines[0]
    assert len(cpu_bf16.cached_results()) == 1


def test_the_probe_times_each_side_in_turns():
    calls = []
    fp32, bf16 = cpu_bf16.seconds_alternated(lambda: calls.append("a"),
                                             lambda: calls.append("b"), rounds=2)
    assert calls == ["a", "b", "a", "b", "a", "b"] and fp32 >= 0 and bf16 >= 0


def test_the_units_can_be_named_instead_of_read(monkeypatch):
    """KOHYA_STUDIO_CPU_BF16_UNITS replaces /proc/cpuinfo (the tests name none: auto is then
    fp32 without a timing probe); a cpuinfo text passed in is still read as it is."""
    monkeypatch.setenv(cpu_bf16.UNITS_ENV, "none")
    assert cpu_bf16.bf16_units() == ()
    monkeypatch.setenv(cpu_bf16.UNITS_ENV, "amx_bf16,avx512_bf16")
    assert cpu_bf16.bf16_units() == ("amx_bf16", "avx512_bf16")
    assert cpu_bf16.bf16_units("flags : fpu avx512_bf16\n") == ("avx512_bf16",)
    monkeypatch.delenv(cpu_bf16.UNITS_ENV)
    assert cpu_bf16.bf16_units() == cpu_bf16.bf16_units(cpu_bf16._read_cpuinfo())


def test_auto_stays_fp32_on_a_cpu_without_bf16_units(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_bf16, "bf16_units", lambda: ())
    monkeypatch.setattr(cpu_precision, "probe", lambda m, c: pytest.fail("probed"))
    s, out = _session(SimpleNamespace(denoiser=torch.nn.Linear(4, 4))), _Out()
    cpu_precision.choose_cpu_precision(s, out)
    assert s.precision == "no" and "no bf16 units" in out.lines[0]


def test_the_probe_times_the_tiny_model_in_both_precisions(tiny_model_dir):
    from trainer.config.sections.model import ModelSection
    from trainer.models.loader import load_base_model

    model = load_base_model(ModelSection(pretrained_model_name_or_path=str(tiny_model_dir)))
    copy = cpu_precision.bf16_copy(model.unet)
    assert {p.dtype for n, p in copy.named_parameters() if "norm" not in n} == {torch.bfloat16}
    assert sum(p.numel() for p in copy.parameters()) == sum(
        p.numel() for p in model.unet.parameters())
    fp32_s, bf16_s = cpu_precision.probe(model, _session(model).cfg)
    assert fp32_s > 0 and bf16_s > 0
    assert {p.dtype for p in model.unet.parameters()} == {torch.float32}  # left as it was


@pytest.mark.parametrize("family, model", [("flux1", "embedded:tiny-flux"),
                                           ("sd3", "embedded:tiny-sd3")])
def test_flow_families_train_in_bf16_on_the_cpu(tmp_path, family, model):
    network = {"train_text_encoder": True}  # LyCORIS is refused for these families
    _bf16_run(tmp_path, model={"pretrained_model_name_or_path": model}, network=network)


def test_the_doctor_reports_the_units_and_the_runs_measurements(monkeypatch, tmp_path):
    from trainer.tools.cpu_bf16_report import cpu_bf16_report

    monkeypatch.setenv(cpu_bf16.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cpu_bf16, "bf16_units", lambda: ("amx_bf16", "avx512_bf16"))
    key = cpu_bf16.probe_key("Test CPU", "2.x", "UNet2DConditionModel 859.5M", 256, 2)
    assert cpu_bf16.store_result(key, 2.5, 1.25) == 0.5
    text = cpu_bf16_report()
    assert "CPU bf16 units      amx_bf16, avx512_bf16" in text
    assert "1024x1024, one call: fp32" in text
    assert f"{key}: 0.50 (bf16 2.00x faster) -> bf16" in text


TRANSFORMER_TWINS = [twin for s in FAMILIES.values() if s.denoiser != "unet" for twin in s.twins]


@pytest.mark.parametrize("twin", TRANSFORMER_TWINS)
def test_the_probe_shapes_its_latents_as_each_family_encodes_them(tmp_path, twin):
    """Qwen-Image's VAE has no ``block_out_channels`` and FLUX.2 packs 2 x 2 patches: the probe's
    noise takes the shape the run's encode path gives, and the probe runs on every twin (an
    edit model that trains on pairs only, Qwen-Image-Edit, with a blank control)."""
    from trainer.families import family_of
    from trainer.models.loader import load_base_model
    from trainer.run.step import encode_images

    model = load_base_model(ModelSection(pretrained_model_name_or_path=twin))
    family = family_of(model)
    with torch.no_grad():
        real = encode_images(model.vae, torch.zeros(1, 3, 64, 96), family).shape
    assert cpu_precision.latent_shape(model, family, 64, 96) == tuple(real)
    cfg = small_config(tmp_path, one_image_dataset(tmp_path),
                       model={"pretrained_model_name_or_path": twin},
                       training={"mixed_precision": "auto"})
    fp32_s, bf16_s = cpu_precision.probe(model, cfg)
    assert fp32_s > 0 and bf16_s > 0
