"""The suite every model family gets: LoRA and DreamBooth train on its tiny twin, what they write
loads back through the studio's own readers, and a stopped run resumes exactly.

It is parametrized over the registry (:data:`trainer.families.FAMILIES`), so a new family's
folder is tested here without a line of its own: each tiny twin of each family
(``FamilySpec.twins``: ``embedded`` and the twins of other variants, such as FLUX.2 [dev]'s
``embedded:tiny-flux2-dev``). Only the families with an embedded tiny twin take part: SD 2.x
has none (it shares SD 1.x's folder and roles, and tests/test_families_train.py builds a tiny
SD 2.x of its own). For each family, on the CPU, at
64 px on two images (so that step 1 of 2 stops mid-epoch):

- **LoRA**, 2 steps: ``tools inspect`` reads the file as the family's LoRA; ``tools merge`` puts
  every module of it onto the base model (none unmatched), and the merged model, read back by
  the loader, differs from the base by exactly what each trained LoRA layer adds.
- **DreamBooth**, 2 steps, text encoders too (so that every family's single file holds every
  part): the diffusers folder and the single file are detected (torch-free) and loaded by the
  loader as the same family, with the denoiser that trained and the same text encoders.
- **Resume**: each run stopped after step 1 and resumed with ``training.resume = "latest"``
  gives the uninterrupted run's losses and file, bit for bit.

diffusers' own loaders reading these files are tests/test_families_train.py's (SD 1.x, 2.x, SDXL)
and tests/test_flow_train.py's (FLUX.1, SD 3.5); this suite keeps to the studio's readers, which
a new family reaches through its folder alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file
from test_resume import StopAt, losses
from train_helpers import small_config

from trainer.config import ModelSection
from trainer.events import Control, ListSink, Step
from trainer.families import FAMILIES, detect_path, family_of
from trainer.methods.dreambooth import DreamBoothMethod
from trainer.methods.lora import LoraMethod
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
class Twin:
    """One tiny twin of a family: its spec's fields, ``embedded`` the twin's own id."""

    def __init__(self, spec: Any, embedded: str):
        self.spec, self.embedded = spec, embedded
        tail = embedded.split(":", 1)[1].removeprefix("tiny-")
        self.key = spec.name if embedded == spec.embedded else tail  # "flux2-dev"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spec, name)

    @property
    def needs_controls(self) -> bool:
        """Whether the twin is an edit model that trains on pairs only (Qwen-Image-Edit): its
        family's ``control_problems`` finds fault with images that have no control."""
        if "_needs" not in self.__dict__:
            model = load_base_model(ModelSection(pretrained_model_name_or_path=self.embedded))
            ask = getattr(family_of(model), "control_problems", None)
            self.__dict__["_needs"] = bool(ask and ask(model, [0]))
        return self.__dict__["_needs"]


TWINS = [Twin(s, twin) for s in FAMILIES.values() for twin in s.twins]  # sd2 has none
STEPS = 2
METHODS = {"lora": LoraMethod, "dreambooth": DreamBoothMethod}


def two_images(root: Path) -> Path:
    """A kohya folder of two captioned images: two batches an epoch at batch 1."""
    folder = root / "1_shapes"
    folder.mkdir(parents=True)
    for i, color in enumerate([(220, 30, 30), (30, 160, 60)]):
        img = Image.new("RGB", (64, 64), (30, 60, 200))
        ImageDraw.Draw(img).ellipse((8 + 8 * i, 8, 56, 56 - 8 * i), fill=color)
        img.save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a shape {i}")
    return root


def controls_of(data: Path) -> Path:
    """A control image per training image of :func:`two_images` (same stems), for edit twins."""
    folder = data.parent / f"{data.name}_controls"
    folder.mkdir(exist_ok=True)
    for image in sorted((data / "1_shapes").glob("*.png")):
        Image.open(image).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(folder / image.name)
    return folder


def denoiser(model: Any) -> torch.nn.Module:
    """The loaded model's UNet or transformer."""
    return model.denoiser


def lora_deltas(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{module path: the weight each trained LoRA layer adds} of a peft-injected module."""
    from peft.tuners.lora import LoraLayer

    return {path: layer.get_delta_weight("default").detach().clone()
            for path, layer in module.named_modules()
            if isinstance(layer, LoraLayer) and "default" in layer.lora_A}


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Runs:
    """The trainings of the suite, each run once per module and shared by the tests."""

    def __init__(self, root: Path):
        self.root, self.data = root, two_images(root / "data")
        self.done: dict[tuple[str, str, str], Any] = {}

    def config(self, spec: Any, mode: str, out: str):
        network = {"train_text_encoder": True} if mode == "dreambooth" else {}
        pairs = {"control_dir": str(controls_of(self.data))} if spec.needs_controls else {}
        return small_config(self.root / spec.key / mode / out, self.data, mode=mode,
                            dataset=pairs,
                            model={"pretrained_model_name_or_path": spec.embedded},
                            training={"max_train_steps": STEPS}, network=network,
                            saving={"save_state": True, "output_name": mode})

    def straight(self, spec: Any, mode: str) -> tuple[Any, list[float], dict]:
        """(result, step losses, what the final save saw: the LoRA layers' deltas or the
        trained modules' states)."""
        key = (spec.key, mode, "straight")
        if key not in self.done:
            seen: dict[str, Any] = {}
            method = METHODS[mode]
            real = method.save

            def save(self, path, model, facts, final=True):
                if final and mode == "lora":
                    seen["deltas"] = lora_deltas(denoiser(model))
                elif final:
                    seen["denoiser"] = state(denoiser(model))
                    seen["encoders"] = {name: state(encoder) for name, encoder, _ in
                                        family_of(model).text_encoders(model)}
                return real(self, path, model, facts, final)

            sink = ListSink()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(method, "save", save)
                result = run(self.config(spec, mode, "straight"), sink)
            assert result.status == "finished", result.error
            self.done[key] = (result, losses(sink), seen)
        return self.done[key]

    def resumed(self, spec: Any, mode: str) -> tuple[Any, list[float], list[int]]:
        """(result, the losses of both halves, the steps of the resumed half)."""
        key = (spec.key, mode, "resumed")
        if key not in self.done:
            cfg = self.config(spec, mode, "resumed")
            control = Control()
            first = StopAt(control, STEPS // 2)
            assert run(cfg, first, control).status == "stopped"
            again = cfg.model_copy(update={"training": cfg.training.model_copy(
                update={"resume": "latest"})})
            second = ListSink()
            result = run(again, second)
            assert result.status == "finished", result.error
            self.done[key] = (result, losses(first) + losses(second),
                              [e.step for e in second.of(Step)])
        return self.done[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("families_suite"))


def base_folder(spec: Any) -> Path:
    return resolve_model_path(spec.embedded)


def file_family(spec: Any) -> str:
    """The family the studio's readers give a LoRA or single file of ``spec``'s: its own, but
    for a family whose files are those of an earlier family of its folder (FLUX.1 Kontext
    writes FLUX.1's: the same keys and ``ss_base_model_version``; its diffusers folder names
    its own pipeline, and model.model_version names it for a file)."""
    return next(s.name for s in FAMILIES.values()
                if s.folder == spec.folder and s.kohya_version == spec.kohya_version)


def load(path: Path, spec: Any, **settings: Any) -> Any:
    model = load_base_model(ModelSection(pretrained_model_name_or_path=str(path), **settings))
    assert model.version == spec.name, f"{path} loaded as {model.version}"
    return model


parametrized = pytest.mark.parametrize("spec", TWINS, ids=[t.key for t in TWINS])


@parametrized
def test_lora_trains_and_its_file_reads_back_as_the_trained_layers(runs, spec, tmp_path):
    from trainer.tools.inspect import inspect
    from trainer.tools.merge import merge
    from trainer.tools.options import InspectOptions, MergeOptions

    result, steps, seen = runs.straight(spec, "lora")
    assert len(steps) == STEPS and all(0 < loss < 10 for loss in steps)
    report = inspect(InspectOptions(path=result.output_path))
    assert report.family == file_family(spec), report.family_reason
    assert report.network_type.startswith("LoRA") and report.modules
    merged = merge(MergeOptions(base=str(base_folder(spec)), loras=[result.output_path],
                                save_folder=str(tmp_path / "merged"), precision="fp32"))
    assert merged.family == spec.name
    assert merged.loras[0].unmatched == [] and merged.loras[0].applied == len(report.modules)
    base = state(denoiser(load(base_folder(spec), spec)))
    after = state(denoiser(load(tmp_path / "merged", spec)))
    deltas = seen["deltas"]
    assert deltas and max(d.abs().max().item() for d in deltas.values()) > 1e-5
    for path, delta in deltas.items():
        key = f"{path}.weight"
        torch.testing.assert_close(after[key] - base[key], delta, atol=1e-6, rtol=1e-4,
                                   msg=lambda m, key=key: f"{key}: {m}")
    moved = {k for k in base if not torch.equal(base[k], after[k])}
    # nothing else changed (a layer whose output nothing reads, such as SD 3.5's context
    # queries in its last block, gets no gradient and adds zeros)
    assert moved == {f"{p}.weight" for p, d in deltas.items() if d.any()}


@parametrized
def test_dreambooth_folder_and_single_file_load_back_as_the_same_family(runs, spec):
    result, steps, seen = runs.straight(spec, "dreambooth")
    assert len(steps) == STEPS
    single = Path(result.output_path)
    folder = single.with_suffix("")
    assert (folder / "model_index.json").is_file() and single.is_file()
    assert detect_path(folder).family == spec.name
    assert detect_path(single).family == file_family(spec)
    base = base_folder(spec)
    from_folder = load(folder, spec)
    from_file = load(single, spec, config_dir=str(base), tokenizer=str(base),
                     model_version=spec.name)
    untrained = load(base, spec)
    trained = seen["denoiser"]
    assert changed(trained, state(denoiser(untrained)))
    assert any(changed(s, state(getattr(untrained, n))) for n, s in seen["encoders"].items())
    for model in (from_folder, from_file):
        got = state(denoiser(model))
        assert got.keys() == trained.keys()
        for k, v in trained.items():
            assert torch.equal(got[k], v), k
    for name, trained_encoder in seen["encoders"].items():
        got = state(getattr(from_folder, name))
        assert got.keys() == trained_encoder.keys(), name
        assert all(torch.equal(got[k], v) for k, v in trained_encoder.items()), name
        in_file = state(getattr(from_file, name))
        assert in_file.keys() == got.keys(), name
        differ = [k for k in got if not torch.equal(got[k], in_file[k])]
        assert all(identity(in_file[k]) for k in differ), f"{name}: {differ}"


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(v, b[k]) for k, v in a.items())


def identity(tensor: torch.Tensor) -> bool:
    """The loader's stand-in for a projection that a family's original layout does not hold
    (SD 3 pools CLIP-L unprojected: its file has no CLIP-L ``text_projection``, which reads
    back as the identity, as diffusers reads it)."""
    return tensor.ndim == 2 and tensor.shape[0] == tensor.shape[1] and \
        torch.equal(tensor, torch.eye(tensor.shape[0], dtype=tensor.dtype))


@parametrized
@pytest.mark.parametrize("mode", ["lora", "dreambooth"])
def test_a_stopped_run_resumes_exactly(runs, spec, mode):
    straight, straight_losses, _ = runs.straight(spec, mode)
    resumed, both, resumed_steps = runs.resumed(spec, mode)
    assert resumed_steps == list(range(STEPS // 2 + 1, STEPS + 1))
    assert both == straight_losses  # every step's loss, bit for bit
    a, b = load_file(straight.output_path), load_file(resumed.output_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
