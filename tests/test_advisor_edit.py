"""The advisor counts an edit model's longer sequences (issue 33): FLUX.1 Kontext's reference and
Qwen-Image-Edit's controls add their packed latent tokens to the transformer's sequence, and
Qwen2.5-VL's reading of Qwen-Image-Edit's controls adds its vision tokens to the text the
transformer reads and to the encode; the number of controls comes from the dataset, else one;
a config without controls is estimated as before; the sized edit presets are the advisor's
cheapest combination for their cards."""

from __future__ import annotations

import sys

import pytest
import torch
from advisor_helpers import assert_cheapest_fit, card
from PIL import Image

from trainer.advisor import flow_memory as fm
from trainer.advisor.advice import GIB
from trainer.advisor.edit_sequence import edit_sequence, sequence_size
from trainer.advisor.flow_sizes import step_bytes, text_tokens
from trainer.config import files as config_io
from trainer.config.files import from_dict
from trainer.config.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
pytestmark = pytest.mark.usefixtures("no_network")
SIDE = 64  # the tiny twins' bucket (pixels)
PX = 512  # a real-size model's step at this side (its tokens dominate the step)


def pairs(root, controls: int = 1, side: int = SIDE):
    """A dataset of one ``side`` px target with ``controls`` controls of its size."""
    (root / "1_edit").mkdir(parents=True, exist_ok=True)
    (root / "control").mkdir(exist_ok=True)
    Image.new("RGB", (side, side), (200, 60, 30)).save(root / "1_edit" / "a.png")
    (root / "1_edit" / "a.txt").write_text("make it red")
    names = ["a"] if controls == 1 else [f"a_{i}" for i in range(controls)]
    for name in names:
        Image.new("RGB", (side, side), (30, 60, 200)).save(root / "control" / f"{name}.png")
    return root


def tiny_cfg(model: str, data, control: bool = True, side: int = SIDE):
    given = {"train_data_dir": str(data), "resolution": side, "min_bucket_reso": SIDE}
    if control:
        given.update(control_dir="control", control_resolution=side)
    return from_dict({"model": {"pretrained_model_name_or_path": model},
                      "network": {"network_dim": 4}, "dataset": given})


def real_config(folder: str) -> dict:
    """A release's transformer config as shipped (real width: a step's tokens dominate it)."""
    import json

    path = PROJECT_ROOT / "trainer/assets/families" / folder / "transformer/config.json"
    return json.loads(path.read_text())


def real_step(config: dict, cfg, monkeypatch, inputs) -> int:
    """The step with the family's memory role giving the transformer the pipeline's own
    inputs with a control (``inputs``): the same small models simulated, extrapolated per
    block as the advisor's step is."""
    memory = fm._memory(config)
    name = "step_inputs" if hasattr(memory, "step_inputs") else "image_inputs"
    with monkeypatch.context() as patch:
        patch.setattr(memory, name, inputs(getattr(memory, name)))
        peaks = [fm._simulate(fm._small_model(config, blocks, cfg), config, (PX, PX), 1, True)
                 for blocks in fm._shapes(config)]
    fixed, first, second = fm._extrapolate(config, peaks)
    doubles, singles = fm._block_counts(config)
    return int(fixed + doubles * first + singles * second)


def test_a_kontext_reference_doubles_the_image_tokens_of_the_step(tmp_path, monkeypatch):
    """The reference's packed tokens follow the target's (BFL's ids, first coordinate 1, as
    the family's predict builds them): the step at the sequence's length, from FLUX.1-dev's
    shipped law, equals the step simulated with those inputs; without control_dir the step is
    the target's alone, as before."""
    data = pairs(tmp_path / "data", side=PX)
    cfg = tiny_cfg("embedded:tiny-flux-kontext", data, side=PX)
    config = real_config("flux1-dev")
    edit = edit_sequence(cfg, (PX, PX))
    assert (edit.count, edit.sizes, edit.image_tokens, edit.text_tokens, edit.source) == (
        1, ((PX, PX),), (PX // 16) ** 2, 0, "dataset")
    assert sequence_size((PX, PX), edit) == (PX, 2 * PX)
    with_control = step_bytes(config, cfg, (PX, PX), 1, True)
    assert with_control == fm.simulate_flow_step(config, cfg, (PX, 2 * PX), 1, True)

    def kontext(image_inputs):
        def build(config, w, h, batch, text):
            one = image_inputs(config, w, h, batch, text)
            ref = one["img_ids"].clone()
            return dict(one, hidden_states=torch.cat([one["hidden_states"]] * 2, dim=1),
                        img_ids=torch.cat([one["img_ids"], ref]))
        return build
    assert with_control == pytest.approx(real_step(config, cfg, monkeypatch, kontext),
                                         rel=0.002)
    plain = tiny_cfg("embedded:tiny-flux-kontext", data, control=False, side=PX)
    assert edit_sequence(plain, (PX, PX)) is None
    without = step_bytes(config, plain, (PX, PX), 1, True)
    assert without == fm.simulate_flow_step(config, plain, (PX, PX), 1, True)
    assert without < 0.8 * with_control


def test_a_qwen_image_edit_control_lengthens_both_sequences(tmp_path, monkeypatch):
    """Qwen-Image-Edit: the control's latents are a second ``img_shapes`` entry after the
    target's, and Qwen2.5-VL's tokens for it stay in the text: the advisor's step equals the
    step simulated with those inputs."""
    data = pairs(tmp_path / "data", side=PX)
    cfg = tiny_cfg("embedded:tiny-qwen-image-edit", data, side=PX)
    config = real_config("qwen-image")
    edit = edit_sequence(cfg, (PX, PX))
    assert edit.image_tokens == (PX // 16) ** 2 and edit.text_tokens > 2
    assert text_tokens(config, cfg, edit) == text_tokens(config) + edit.text_tokens

    def qwen(step_inputs):
        def build(config, w, h, batch, text):
            one = step_inputs(config, w, h, batch, text + edit.text_tokens)
            shape = one["img_shapes"][0][0]
            return dict(one, hidden_states=torch.cat([one["hidden_states"]] * 2, dim=1),
                        img_shapes=[[shape, shape]] * batch)
        return build
    estimate = step_bytes(config, cfg, (PX, PX), 1, True)
    assert estimate == pytest.approx(real_step(config, cfg, monkeypatch, qwen), rel=0.002)
    plain = tiny_cfg("embedded:tiny-qwen-image-edit", data, control=False, side=PX)
    without = step_bytes(config, plain, (PX, PX), 1, True)
    assert without == fm.simulate_flow_step(config, plain, (PX, PX), 1, True)
    assert without < 0.8 * estimate


def test_flux2_references_are_counted_once_the_family_takes_them(tmp_path, monkeypatch):
    """FLUX.2's references (optional, each at its own size up to about 1024 x 1024: the
    family's ControlSpec, patched in here as FLUX.2 declares it) follow the target's tokens
    with 4-axis ids: the advisor's step equals the step simulated with those inputs; without
    control_dir nothing is counted."""
    from dataclasses import replace

    from trainer.families import FAMILIES
    from trainer.families.spec import ControlSpec

    monkeypatch.setitem(FAMILIES, "flux2", replace(FAMILIES["flux2"], controls=ControlSpec(
        max=10, area=1024 * 1024, multiple=16)))
    data = pairs(tmp_path / "data", side=PX)
    plain = tiny_cfg("embedded:tiny-flux2", data, control=False, side=PX)
    # the config rules read which families take controls when the schema is built: set the
    # folder past them, as a config of the family that declares it loads
    cfg = plain.model_copy(update={"dataset": plain.dataset.model_copy(
        update={"control_dir": "control", "control_resolution": PX})})
    config = real_config("flux2-klein-4b")
    edit = edit_sequence(cfg, (PX, PX))
    assert (edit.count, edit.image_tokens, edit.text_tokens) == (1, (PX // 16) ** 2, 0)

    def flux2(image_inputs):
        def build(config, w, h, batch, text):
            one = image_inputs(config, w, h, batch, text)
            return dict(one, hidden_states=torch.cat([one["hidden_states"]] * 2, dim=1),
                        img_ids=torch.cat([one["img_ids"]] * 2, dim=1))
        return build
    estimate = step_bytes(config, cfg, (PX, PX), 1, True)
    assert estimate == pytest.approx(real_step(config, cfg, monkeypatch, flux2), rel=0.002)
    assert edit_sequence(plain, (PX, PX)) is None
    assert step_bytes(config, plain, (PX, PX), 1, True) < 0.8 * estimate


def test_the_number_of_controls_comes_from_the_dataset_else_one(tmp_path):
    two = tiny_cfg("embedded:tiny-qwen-image-edit", pairs(tmp_path / "two", controls=2))
    one = tiny_cfg("embedded:tiny-qwen-image-edit", pairs(tmp_path / "one"))
    unread = tiny_cfg("embedded:tiny-qwen-image-edit", tmp_path / "missing")
    found = [edit_sequence(c, (SIDE, SIDE)) for c in (two, one, unread)]
    assert [(e.count, e.source) for e in found] == [(2, "dataset"), (1, "dataset"),
                                                   (1, "default")]
    assert found[0].image_tokens == 2 * found[1].image_tokens
    assert found[0].text_tokens == 2 * found[1].text_tokens


def test_a_kontext_reference_is_sized_from_its_own_aspect(tmp_path):
    """A stored 1100 x 800 reference is trained at BFL's preferred Kontext size nearest its
    aspect (1184 x 880 of diffusers' PREFERRED_KONTEXT_RESOLUTIONS), whatever the target's
    bucket: its tokens are that size's."""
    from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

    data = pairs(tmp_path / "data")
    (data / "control" / "a.png").unlink()
    Image.new("RGB", (1100, 800)).save(data / "control" / "a.png")
    cfg = from_dict({"model": {"pretrained_model_name_or_path": "embedded:tiny-flux-kontext"},
                     "dataset": {"train_data_dir": str(data), "control_dir": "control",
                                 "resolution": SIDE, "min_bucket_reso": SIDE}})
    edit = edit_sequence(cfg, (SIDE, SIDE))
    nearest = min(PREFERRED_KONTEXT_RESOLUTIONS, key=lambda wh: abs(1100 / 800 - wh[0] / wh[1]))
    assert edit.sizes == (nearest,) == ((1184, 880),) and edit.source == "dataset"
    assert edit.image_tokens == (1184 // 16) * (880 // 16)


def test_a_dataset_tomls_control_directory_is_counted(tmp_path):
    """Without dataset.control_dir, a dataset TOML subset's ``control_directory`` (musubi-
    tuner's key) pairs the controls, and the advisor counts them."""
    data = pairs(tmp_path / "data", controls=2)
    toml = tmp_path / "dataset.toml"
    toml.write_text(f"""[general]\nresolution = {SIDE}\n\n[[datasets]]\n\n[[datasets.subsets]]
image_dir = "{data / '1_edit'}"\ncontrol_directory = "{data / 'control'}"\n""")
    cfg = from_dict({"model": {"pretrained_model_name_or_path": "embedded:tiny-qwen-image-edit"},
                     "network": {"network_dim": 4},
                     "dataset": {"dataset_config": str(toml), "min_bucket_reso": SIDE}})
    edit = edit_sequence(cfg, (SIDE, SIDE))
    assert (edit.count, edit.source) == (2, "dataset")


@pytest.mark.parametrize("variant, size", [("edit", (1024, 1024)), ("edit", (1024, 768)),
                                           ("edit-2509", (1024, 1024)),
                                           ("edit-2509", (1248, 832))])
def test_the_vision_tokens_are_the_processors(variant, size):
    """Edit's pipeline hands Qwen2.5-VL the control as its latents have it, Plus at about
    384 x 384 (diffusers' ``calculate_dimensions(CONDITION_IMAGE_SIZE, ...)``); the pads are
    what the shipped processor makes of that image (its ``image_grid_thw``)."""
    import json

    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
        CONDITION_IMAGE_SIZE,
        calculate_dimensions,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from trainer.families import spec
    from trainer.families.qwen_image import memory

    side = memory.text_side(variant, size)
    if variant != "edit":
        assert side == calculate_dimensions(CONDITION_IMAGE_SIZE, size[0] / size[1])
    folder = spec("qwen_image").assets("base") / "processor"
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder), local_files_only=True)
    grid = processor(images=[Image.new("RGB", side)], return_tensors="pt")["image_grid_thw"]
    config = json.loads((folder / "preprocessor_config.json").read_text())
    assert memory.vision_tokens(side, config) == int(grid.prod()) // 4


def test_the_text_encoders_phase_counts_the_control(tmp_path):
    """Encoding the captions with their controls holds Qwen2.5-VL's reading of them on the
    device beside its weights: the text phase grows by that line, and an Edit model's 1024 px
    control adds its vision tokens to the text the transformer reads."""
    from edit_files import edit_folder

    from trainer.advisor.estimate import advise

    model = edit_folder(tmp_path / "models", "qwen-image-edit")
    data = pairs(tmp_path / "data", side=1024)
    phases = {}
    for control in (False, True):
        cfg = config_io.load(PROJECT_ROOT / "presets/lora/qwen-image-edit-24gb.toml", [
            f'model.pretrained_model_name_or_path="{model}"',
            f'dataset.train_data_dir="{data}"', f'saving.output_dir="{tmp_path / "out"}"']
            + (['dataset.control_dir="control"'] if control else []))
        advice = advise(cfg, card(24))
        phases[control] = {p.name: p for p in advice.phases}["text cache"]
    reading = [b for what, b in phases[True].lines if what.startswith("Qwen2.5-VL reading")]
    assert len(reading) == 1 and reading[0] > 0
    assert phases[True].device == phases[False].device + reading[0]
    edit = edit_sequence(cfg, (1024, 1024))
    assert edit.text_tokens == 37 * 37 + 2  # 1036 px a side: 74 x 74 patches, merged 2 x 2


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from edit_files import edit_folder

    root = tmp_path_factory.mktemp("edit")
    return {m: edit_folder(root / "models", m) for m in ("flux1-kontext-dev", "qwen-image-edit",
                                                        "qwen-image-edit-2509")}, root


@pytest.fixture
def ram(monkeypatch):
    from trainer.system import device

    monkeypatch.setattr(device, "system_memory", lambda: 256 * GIB)


PRESETS = [("flux1-kontext-dev", "flux1-kontext-dev-24gb", 24),
           ("flux1-kontext-dev", "flux1-kontext-dev-16gb", 16),
           ("qwen-image-edit", "qwen-image-edit-24gb", 24),
           ("qwen-image-edit", "qwen-image-edit-16gb", 16),
           ("qwen-image-edit-2509", "qwen-image-edit-24gb", 24),
           ("qwen-image-edit-2509", "qwen-image-edit-16gb", 16)]


@pytest.mark.parametrize("model, preset, gb", PRESETS, ids=[f"{p[0]}-{p[2]}" for p in PRESETS])
def test_each_edit_preset_is_the_cheapest_combination_that_fits_its_card(folders, ram, model,
                                                                         preset, gb):
    """With one 1024 px control (``dataset.control_dir`` set, as the presets' comments say),
    the preset's base precision, block swap and batch are what the advisor recommends for its
    card from bf16, its text encoder fits the card while the captions are encoded, and nothing
    is left to advise."""
    models, root = folders
    data = pairs(root / "data", side=1024)
    cfg = config_io.load(PROJECT_ROOT / "presets" / "lora" / f"{preset}.toml", [
        f'model.pretrained_model_name_or_path="{models[model]}"',
        f'dataset.train_data_dir="{data}"', 'dataset.control_dir="control"',
        f'saving.output_dir="{root / "out"}"'])
    assert_cheapest_fit(cfg, gb)
