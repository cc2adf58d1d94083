"""The advisor's laws (issue 19: an answer in under 2 s): a step's memory and work as laws of
the bucket, the batch and the LoRA rank, from two simulations, equal the whole simulation at
other values (tiny SD 1.x and SDXL in each mode, dtype and checkpointing; the shipped SD 1.5-
size law at 512 and 768 px; FLUX.1 and SD 3.5's small models); the laws shipped for the
families' models are those the code makes; and a first estimate for them simulates nothing
(no timing here: bench/advisor_speed.py measures it)."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest
import torch
from train_helpers import preset_config

from trainer.advisor import flow_memory as fm
from trainer.advisor import footprint, law, shipped
from trainer.config.files import from_dict
from trainer.config.paths import PROJECT_ROOT

FAMILIES = PROJECT_ROOT / "trainer" / "assets" / "families"


@pytest.fixture
def nothing_shipped(monkeypatch, tmp_path):
    """A fresh disk cache and no shipped laws: every law is made here."""
    monkeypatch.setenv("KOHYA_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(shipped._LOADED, "index", {})
    from trainer.advisor import model_configs

    monkeypatch.setattr(model_configs, "_CACHE", {})


def test_a_monomial_from_two_sizes():
    first, varied = (2, 64, 64, 4, 4), (True, True, True, True, False)
    # batch x latent pixels x rank: 2x, 15x, 7x from the first simulation to the second
    exps, c, exact = law.fit(2 * 64 * 64 * 4 * 10, 4 * 192 * 320 * 28 * 10, first, varied)
    assert exact and exps == (1, 1, 1, 1, 0) and c == 10
    exps, c, exact = law.fit(2 * 65 * 65, 4 * 193 * 321, first, varied)  # a one-pixel pad
    assert not exact and exps == (1, 1, 1, 0, 0) and c == pytest.approx(65 * 65 / 64 / 64)
    assert law._quadratic([Fraction(1), Fraction(2), Fraction(4)],
                          [Fraction(5 + 3 * x) for x in (1, 2, 4)]) == [5, 3, 0]


LORA = ("lora", {})
CASES = [  # (model, (mode, network), dtype, checkpointing)
    ("embedded:tiny-sd15", LORA, torch.float32, False),
    ("embedded:tiny-sd15", LORA, torch.bfloat16, True),
    ("embedded:tiny-sd15", ("lora", {"network_dim": 16, "network_alpha": 1.0, "conv_dim": 4}),
     torch.float32, True),
    ("embedded:tiny-sd15", ("dreambooth", {}), torch.float32, True),
    ("embedded:tiny-sd15", ("textual_inversion", {"token_string": "<t>"}), torch.float32,
     False),
    ("embedded:tiny-sdxl", ("lora", {"train_text_encoder": True}), torch.float16, False),
    ("embedded:tiny-sdxl", ("dreambooth", {"train_text_encoder": True}), torch.bfloat16, True),
]


@pytest.mark.parametrize("model, method, dtype, gc", CASES, ids=[
    f"{m[9:]}-{mode}{'-' if net else ''}{'-'.join(net)}-{str(d)[6:]}-{'gc' if gc else 'nogc'}"
    for m, (mode, net), d, gc in CASES])
def test_a_law_equals_the_whole_simulation(tmp_path, nothing_shipped, model, method, dtype, gc):
    """Every field of the footprint (bytes, work, parameter counts, operations) at buckets,
    batches and ranks other than the laws' simulations."""
    mode, network = method
    cfg = preset_config(tmp_path, mode, model={"pretrained_model_name_or_path": model},
                        network=network)
    configs = footprint.read_configs(cfg.model)
    points = [((64, 64), 1), ((128, 96), 3), ((96, 160), 1)]
    for bucket, batch in points:
        got = footprint.simulate_step(configs, cfg, bucket, batch, dtype, gc)
        whole = footprint.simulate_step(configs, cfg, bucket, batch, dtype, gc, full=True)
        assert got == whole, (bucket, batch)  # every field, bytes and flops alike
    law_2 = footprint.step_law(configs, cfg, dtype, gc, 2)
    assert law_2 is not None and law_2.inexact == 0
    if mode == "lora":  # the rank is a variable of the law: another rank, no simulation
        same = cfg.network.network_alpha == cfg.network.network_dim  # the key says which
        other = preset_config(tmp_path, mode, model={"pretrained_model_name_or_path": model},
                              network={**network, "network_dim": 32,
                                       "network_alpha": 32.0 if same else 3.0})
        assert footprint.step_law(configs, other, dtype, gc, 2, simulate=False) is law_2
        got = footprint.simulate_step(configs, other, (128, 64), 4, dtype, gc)
        assert got == footprint.simulate_step(configs, other, (128, 64), 4, dtype, gc,
                                              full=True)


def test_a_bucket_off_the_unets_grid_is_close(tmp_path, nothing_shipped):
    """Sides that the UNet's deeper levels cannot halve evenly round up there, which the law
    (linear in the pixels) does not: the tiny model's levels are a few pixels wide, and its
    law is then a few percent low (SD 1.5's: below 0.5%, in the test below)."""
    cfg = preset_config(tmp_path)
    configs = footprint.read_configs(cfg.model)
    for bucket in ((72, 72), (88, 120), (264, 264)):
        got = footprint.simulate_step(configs, cfg, bucket, 2, torch.float32, False)
        whole = footprint.simulate_step(configs, cfg, bucket, 2, torch.float32, False,
                                        full=True)
        assert whole.step_bytes * 0.95 < got.step_bytes <= whole.step_bytes
        assert got.flops == pytest.approx(whole.flops, rel=0.1)


def test_the_encode_law_equals_the_simulation(nothing_shipped):
    configs = footprint.embedded_configs("embedded:tiny-sd15")
    for bucket, batch in (((64, 64), 1), ((128, 96), 4), ((520, 512), 4)):
        assert footprint.simulate_encode(configs, bucket, batch) == \
            footprint.simulate_encode(configs, bucket, batch, full=True)


def test_the_work_is_what_flop_counter_mode_counts(tmp_path):
    from torch.utils.flop_counter import FlopCounterMode

    cfg = preset_config(tmp_path)
    configs = footprint.read_configs(cfg.model)
    work = footprint.Work()
    model, nets = footprint._training_model(configs, cfg, torch.float32, True, work)
    footprint._one_step(model, configs, (64, 64), 2, torch.float32, work,
                        footprint.LiveBytes(footprint._storages(*nets), work))
    attention = footprint.Work()
    model, _ = footprint._training_model(configs, cfg, torch.float32, True, attention)
    counter = FlopCounterMode(display=False)
    footprint._one_step(model, configs, (64, 64), 2, torch.float32, attention, counter)
    assert work.total == counter.get_total_flops() + attention.total


def test_the_shipped_sd15_law_equals_the_whole_simulation(tmp_path):
    """SD 1.5's UNet (860 M parameters), DreamBooth and LoRA from the shipped laws against a
    whole simulation of each step (seconds each on the meta device): equal on the UNet's
    64 px grid, within 0.5% off it."""
    folder = str(FAMILIES / "sd1")
    db = preset_config(tmp_path, "dreambooth", model={"pretrained_model_name_or_path": folder})
    lora = preset_config(tmp_path, "lora", model={"pretrained_model_name_or_path": folder},
                         network={"network_dim": 32, "network_alpha": 16.0})
    configs = footprint.read_configs(db.model)
    for cfg, bucket, batch, dtype, gc in ((db, (512, 512), 1, torch.float32, False),
                                          (lora, (768, 640), 2, torch.bfloat16, True),
                                          (lora, (352, 416), 2, torch.bfloat16, True)):
        assert footprint.step_law(configs, cfg, dtype, gc, batch, simulate=False) is not None
        got = footprint.simulate_step(configs, cfg, bucket, batch, dtype, gc)
        whole = footprint.simulate_step(configs, cfg, bucket, batch, dtype, gc, full=True)
        if bucket[1] % 64 == 0:  # on the grid: exact
            assert got == whole
        else:
            assert got.step_bytes == pytest.approx(whole.step_bytes, rel=0.005)


def _flow_config(family: str) -> dict:
    from trainer.advisor.make_shipped import flow_config

    return flow_config("embedded:tiny-flux" if family == "flux1" else "embedded:tiny-sd3")


@pytest.mark.parametrize("family", ["flux1", "sd3"])
def test_a_flow_law_equals_the_small_models_simulations(nothing_shipped, family):
    config = _flow_config(family)
    for rank, gc in ((4, True), (16, False)):
        cfg = from_dict({"network": {"network_dim": rank}})
        for size, batch in (((128, 128), 2), ((64, 96), 1), ((192, 128), 3)):
            for blocks in fm._shapes(config):
                got = fm.flow_law(config, blocks, cfg, gc, batch)
                assert got is not None and got.inexact == 0
                whole = fm._simulate(fm._small_model(config, blocks, cfg), config, size, batch,
                                     gc)
                assert got.peak((batch, size[1] // 16, size[0] // 16, rank, 1)) == whole


def test_the_shipped_laws_are_current(tmp_path, nothing_shipped):
    """Made by this code (else: python -m trainer.advisor.make_shipped), their tiny entries
    as this code makes them, the embedded models' configs as their builders make them."""
    from trainer.advisor import make_shipped
    from trainer.advisor.model_configs import built_configs

    index = json.loads((shipped.FOLDER / "index.json").read_text(encoding="utf-8"))
    made = {e["file"]: e["code"] for e in index["models"].values()}
    assert set(made) == {shipped.file_name(m) for m in shipped.MODELS}
    for model in shipped.MODELS:
        assert made[shipped.file_name(model)] == shipped.code_stamp(model), \
            f"python -m trainer.advisor.make_shipped --only {model}"
    for model in ("embedded:tiny-sd15", "embedded:tiny-sdxl"):
        assert shipped.embedded_configs(model) is not None
        assert footprint.embedded_configs(model).key == built_configs(model).key
    for model in ("embedded:tiny-flux", "embedded:tiny-sd3"):
        assert shipped.embedded_flow_config(model) == json.loads(json.dumps(
            make_shipped.flow_config(model)))
    configs = footprint.embedded_configs("embedded:tiny-sd15")
    cfg = preset_config(tmp_path)
    made = {footprint.laws.step_key(configs, cfg, dtype, gc, batch): footprint._law_json(
        footprint.step_law(configs, cfg, dtype, gc, batch))
        for dtype, gc, batch in ((torch.float32, False, 2), (torch.bfloat16, True, 1))}
    shipped._LOADED.pop("index")  # now read what ships
    for key, value in made.items():
        assert shipped.lookup(configs.key, key) == json.loads(json.dumps(value))


def test_a_law_made_by_other_code_is_refused(monkeypatch):
    """Each model's laws hold while the advisor's code and its own family's memory role are
    those that made them: a change to FLUX.2's role refuses FLUX.2's laws only, a change to
    the advisor's simulation every model's."""
    real = shipped._code

    def changed(where):
        return lambda path: real(path) + ("\nchanged" if where(path) else "")
    monkeypatch.setattr(shipped, "_LOADED", {})
    served = set(shipped._index().values())
    assert served == {shipped.file_name(m) for m in shipped.MODELS}
    monkeypatch.setattr(shipped, "_code", changed(lambda p: p.parent.name == "flux2"))
    monkeypatch.setattr(shipped, "_LOADED", {})
    flux2 = {shipped.file_name(m) for m in shipped.MODELS if "flux2" in m}
    assert len(flux2) == 4 and set(shipped._index().values()) == served - flux2
    monkeypatch.setattr(shipped, "_code", changed(lambda p: p.name == "flow_memory.py"))
    monkeypatch.setattr(shipped, "_LOADED", {})
    assert shipped._index() == {}


FIRST_ANSWER = """
import sys
from trainer.advisor.estimate import advise
from trainer.config import files as config_io
from trainer.system.device import DeviceInfo
card = DeviceInfo("cuda", "NVIDIA GeForce RTX 4080", "cuda:0", 16 * 2**30, True, True, "2.13")
for preset, overrides in {cases}:
    advice = advise(config_io.load(preset, overrides), card)
    assert advice.memory is not None and not advice.problems, advice.problems
    cpu = advise(config_io.load(preset, overrides))
    assert cpu.memory is not None, cpu.problems
print(sorted(m for m in ("diffusers", "transformers", "peft", "accelerate") if m in sys.modules))
"""


def test_a_first_estimate_for_the_families_simulates_nothing(tmp_path):
    """SD 1.5-size DreamBooth at 512 px, SDXL-size LoRA at 1024 px, FLUX.1-dev, SD 3.5 and
    FLUX.2 [klein] 9B at 1024 px and the GUI's default (the tiny model), with advice for a 16
    GB card, in a new process with an empty cache: no simulation, so none of the model
    libraries is imported."""
    def model(name: str) -> str:
        return f"model.pretrained_model_name_or_path={json.dumps(str(FAMILIES / name))}"
    cases = [
        ("presets/dreambooth/default.toml", [model("sd1"), "dataset.resolution=512",
                                             "sampling.sample_prompts=[]"]),
        ("presets/lora/default.toml", [model("sdxl"), "dataset.resolution=1024"]),
        ("presets/lora/flux1-dev-16gb.toml", [model("flux1-dev")]),
        ("presets/lora/sd35-large-16gb.toml", [model("sd35-large")]),
        ("presets/lora/flux2-klein-9b-16gb.toml", [model("flux2-klein-9b")]),
        ("presets/lora/default.toml", []),
    ]
    code = FIRST_ANSWER.format(cases=repr(cases))
    env = {**__import__("os").environ, "KOHYA_STUDIO_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=PROJECT_ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
