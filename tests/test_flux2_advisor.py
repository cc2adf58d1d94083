"""The advisor knows FLUX.2 (issue 32): a step simulated on small models of the same width (one
or two double and single blocks) and extrapolated per block equals the whole model's simulated
step; the weights the memory options act on are counted per block; on the releases' split files
(full size, sparse: bench/flux2_files.py) the klein presets are the cheapest combination that
fits their cards, the text encoder's phase counts on the device, and FLUX.2 [dev] on a 24 GB
card needs far less host memory than SimpleTuner's 96 GB minimum."""

from __future__ import annotations

import sys

import pytest
from advisor_helpers import assert_cheapest_fit, card

from trainer.advisor import flow_memory as fm
from trainer.advisor.advice import FITS_BELOW, GIB
from trainer.advisor.estimate import advise
from trainer.advisor.flow_advice import flow_transformer_config
from trainer.config import files as config_io
from trainer.config.files import from_dict
from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
pytestmark = pytest.mark.usefixtures("no_network")


def tiny_config(double: int, single: int) -> dict:
    from trainer.families.flux2.tiny import build_flux2_components

    t = build_flux2_components()["transformer"]
    return dict(t.config, _class_name=type(t).__name__, num_layers=double,
                num_single_layers=single)


def tiny_cfg(rank: int):
    return from_dict({"model": {"model_version": "flux2"},
                      "network": {"network_dim": rank}}, "flux2")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_per_block_extrapolation_equals_the_whole_models_step(checkpointing):
    config, cfg = tiny_config(3, 4), tiny_cfg(1)
    small = fm.simulate_flow_step(config, cfg, (64, 64), 1, checkpointing)
    whole = fm.simulate_flow_step(config, cfg, (64, 64), 1, checkpointing, full=True)
    assert small == pytest.approx(whole, rel=0.001)


def test_the_weights_are_counted_per_block():
    config, cfg = tiny_config(3, 4), tiny_cfg(2)
    w = fm.flow_weights(config, cfg)
    model = fm.meta_transformer(config)
    assert w.total == sum(p.numel() for p in model.parameters())
    double = sum(p.numel() for p in model.transformer_blocks[0].parameters())
    single = sum(p.numel() for p in model.single_transformer_blocks[0].parameters())
    assert w.units == (double,) * 3 + (single,) * 4
    fm._with_adapters(model, cfg)
    assert w.lora == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)


def test_the_tiny_twin_is_advised():
    """``embedded:tiny-flux2``: an estimate with every line (FLUX.2 had none before: issue 32)."""
    from trainer.config import TrainConfig

    cfg = TrainConfig.model_validate({"model": {"pretrained_model_name_or_path":
                                                "embedded:tiny-flux2"}})
    advice = advise(cfg, card(16))
    assert not advice.problems, advice.problems
    lines = dict(advice.memory.lines)
    assert lines["activations"] > 0 and advice.memory.fits and advice.timing is not None


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Each release's three files (transformer, text encoder, VAE), sparse, and a dataset of
    one 1024 px image."""
    from flux2_files import flux2_files
    from PIL import Image

    root = tmp_path_factory.mktemp("flux2")
    data = root / "data" / "1_square"
    data.mkdir(parents=True)
    Image.new("RGB", (1024, 1024), (30, 60, 200)).save(data / "a.png")
    (data / "a.txt").write_text("a blue square")
    files = {v: flux2_files(root / v, v) for v in ("klein-4b", "klein-9b", "dev")}
    return files, root


@pytest.fixture
def ram(monkeypatch):
    """The machine's RAM as the test says (not this machine's)."""
    from trainer.system import device

    def set_ram(gib: float) -> None:
        monkeypatch.setattr(device, "system_memory", lambda: int(gib * GIB))
    set_ram(256)
    return set_ram


def load(releases, variant: str, preset: str, **changes):
    files, root = releases
    given = {"model.pretrained_model_name_or_path": files[variant]["transformer"],
             "model.text_encoder": files[variant]["text_encoder"],
             "model.ae": files[variant]["ae"],
             "dataset.train_data_dir": str(root / "data"),
             "saving.output_dir": str(root / "out"), **changes}
    overrides = [f"{k}={v!r}".replace("'", '"') if isinstance(v, str) else
                 f"{k}={str(v).lower()}" for k, v in given.items()]
    return config_io.load(PROJECT_ROOT / "presets" / "lora" / f"{preset}.toml", overrides)


def test_the_releases_are_read_from_their_files(releases):
    """The transformer's config from the file's header: klein 4B 5 + 20 blocks of 3072,
    klein 9B 8 + 24 of 4096, dev 8 + 48 of 6144 with guidance (the reference sheet's
    shapes); the parameter counts the releases are named for."""
    shapes = {"klein-4b": (5, 20, 3072, 4e9), "klein-9b": (8, 24, 4096, 9e9),
              "dev": (8, 48, 6144, 32e9)}
    for variant, (double, single, width, named) in shapes.items():
        cfg = load(releases, variant, "flux2-klein-4b-24gb")
        config = flow_transformer_config(cfg.model)
        assert (config["num_layers"], config["num_single_layers"]) == (double, single)
        assert config["num_attention_heads"] * config["attention_head_dim"] == width
        assert config["guidance_embeds"] == (variant == "dev")
        w = fm.flow_weights(config, cfg)
        assert 0.9 * named < w.total < 1.05 * named and len(w.units) == double + single


PRESETS = [("klein-4b", "flux2-klein-4b-24gb", 24), ("klein-4b", "flux2-klein-4b-16gb", 16),
           ("klein-4b", "flux2-klein-4b-12gb", 12), ("klein-9b", "flux2-klein-9b-24gb", 24),
           ("klein-9b", "flux2-klein-9b-16gb", 16), ("dev", "flux2-dev-24gb", 24)]


@pytest.mark.parametrize("variant, preset, gb", PRESETS, ids=[p[1] for p in PRESETS])
def test_each_preset_is_the_cheapest_combination_that_fits_its_card(releases, ram, variant,
                                                                    preset, gb):
    """The preset's base precision, block swap and batch are what the advisor recommends for
    its card from bf16 (the cheapest that fits: the fastest), its text encoder fits the card
    while the captions are encoded, and nothing is left to advise."""
    assert_cheapest_fit(load(releases, variant, preset), gb)


def test_a_text_encoder_too_large_for_the_card_is_advised_fp8(releases, ram):
    """klein 9B on a 12 GB card: its Qwen3-8B (7.6 B parameters: 14 GiB in bf16) does not fit
    while the captions are encoded; the advisor says fp8 text encoder beside the step's
    combination (fp8 and blocks swapped), and with both every phase fits."""
    cfg = load(releases, "klein-9b", "flux2-klein-9b-16gb", **{"model.fp8_text_encoders": False})
    advice = advise(cfg, card(12))
    text = next(r for r in advice.recommendations if "model.fp8_text_encoders" in r.changes)
    assert text.changes == {"model.fp8_text_encoders": True} and text.saves > 0
    step = next(r for r in advice.recommendations if "training.blocks_to_swap" in r.changes)
    both = load(releases, "klein-9b", "flux2-klein-9b-16gb", **{
        "training.blocks_to_swap": step.changes["training.blocks_to_swap"]})
    fixed = advise(both, card(12))
    assert not fixed.problems and fixed.memory.fits
    before, after = ({p.name: p for p in a.phases}["text cache"] for a in (advice, fixed))
    assert after.device < 12 * GIB * FITS_BELOW < before.device


def test_dev_on_a_24_gb_card(releases, ram):
    """FLUX.2 [dev]'s 32 B transformer trains on a 24 GB card with fp8 and blocks swapped; its
    Mistral-Small-3 (24 B parameters in ComfyUI's file, 19 B of them read: the first 31
    layers, as the loader builds it frozen) fits that card in fp8 only, and the advisor says
    so; the host holds at its peak far less than SimpleTuner's 96 GB minimum (the text encoder
    is read and released before the transformer is built: never both), and more than either
    part alone."""
    cfg = load(releases, "dev", "flux2-klein-4b-24gb", **{"model.fp8_text_encoders": False})
    advice = advise(cfg, card(24))
    changes = {}
    for r in advice.recommendations:
        changes.update({k: v for k, v in r.changes.items() if v})
    assert changes["model.base_precision"] == "fp8" and changes["training.blocks_to_swap"]
    assert changes["model.fp8_text_encoders"] is True
    final = advise(load(releases, "dev", "flux2-klein-4b-24gb", **changes), card(24))
    assert not final.problems and final.memory.fits
    phases = {p.name: p for p in final.phases}
    assert phases["text cache"].device < 24 * GIB * FITS_BELOW
    transformer = dict(phases["transformer"].lines)["transformer (fp8 storage)"]
    text = next(b for what, b in phases["load"].lines if what.startswith("mistral3"))
    assert 28 * GIB < transformer < 32 * GIB and 17 * GIB < text < 19 * GIB
    peak = final.host_peak()
    assert max(transformer, text) < peak.host < 96e9 * 0.5
    assert "swapped blocks (pinned)" in dict(phases["step"].lines)
