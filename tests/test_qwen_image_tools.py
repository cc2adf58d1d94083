"""The LoRA tools on Qwen-Image's files, in the three forms the peers write them: musubi-tuner's
kohya form (``lora_unet_transformer_blocks_0_attn_to_q`` + ``alpha``, what this studio writes),
ai-toolkit's ``diffusion_model.<path>.lora_A/B`` and diffusers' example's ``transformer.<path>``
(both without alpha, scale 1). Each is told to be Qwen-Image without metadata, merges onto the
base with every module matched and the same result, and continues training as
``network.network_weights`` with the file's update."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.families.qwen_image.lora import qwen_target_modules
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
TWIN = "embedded:tiny-qwen-image"
RANK, ALPHA = 4, 2.0


@pytest.fixture(scope="module")
def base():
    return load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))


@pytest.fixture(scope="module")
def forms(base, tmp_path_factory):
    """{form: file} of one random LoRA over musubi-tuner's targets, and its update per path."""
    root = tmp_path_factory.mktemp("qwen_forms")
    gen = torch.Generator().manual_seed(2)
    kohya, aitk, example, deltas = {}, {}, {}, {}
    for path in qwen_target_modules(base.denoiser):
        weight = base.denoiser.get_submodule(path).weight
        down = torch.randn(RANK, weight.shape[1], generator=gen) * 0.1
        up = torch.randn(weight.shape[0], RANK, generator=gen) * 0.1
        name = "lora_unet_" + path.replace(".", "_")
        kohya.update({f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up,
                      f"{name}.alpha": torch.tensor(ALPHA)})
        baked = up * (ALPHA / RANK)
        aitk.update({f"diffusion_model.{path}.lora_A.weight": down,
                     f"diffusion_model.{path}.lora_B.weight": baked})
        example.update({f"transformer.{path}.lora_A.weight": down,
                        f"transformer.{path}.lora_B.weight": baked})
        deltas[path] = baked @ down
    files = {}
    for form, tensors in (("musubi", kohya), ("ai-toolkit", aitk), ("diffusers", example)):
        files[form] = root / f"{form}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, files[form])
    return files, deltas


FORMS = ["musubi", "ai-toolkit", "diffusers"]


@pytest.mark.parametrize("form", FORMS)
def test_inspect_tells_each_form_is_qwen_image(forms, form):
    from trainer.tools.inspect import inspect
    from trainer.tools.options import InspectOptions

    files, deltas = forms
    report = inspect(InspectOptions(path=str(files[form])))
    assert report.family == "qwen_image", report.family_reason
    assert len(report.modules) == len(deltas)


@pytest.mark.parametrize("form", FORMS)
def test_merge_applies_each_form_to_the_same_weights(forms, form, base, tmp_path):
    from trainer.tools.merge import merge
    from trainer.tools.options import MergeOptions

    files, deltas = forms
    report = merge(MergeOptions(base=str(resolve_model_path(TWIN)), loras=[str(files[form])],
                                save_folder=str(tmp_path / "merged"), precision="fp32"))
    assert report.loras[0].unmatched == [] and report.loras[0].applied == len(deltas)
    merged = load_base_model(ModelSection(pretrained_model_name_or_path=str(tmp_path / "merged")))
    before, after = base.denoiser.state_dict(), merged.denoiser.state_dict()
    for path, delta in deltas.items():
        torch.testing.assert_close(after[f"{path}.weight"] - before[f"{path}.weight"], delta,
                                   atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_network_weights_continue_from_each_form(forms, form, tmp_path):
    """The network built from ``network.network_weights`` adds the file's update."""
    from trainer.methods.lora import LoraMethod

    files, deltas = forms
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       model={"pretrained_model_name_or_path": TWIN},
                       network={"network_dim": RANK, "network_alpha": 1.0,
                                "network_weights": str(files[form])})
    model = load_base_model(cfg.model)
    LoraMethod(cfg).prepare(model)
    root = model.denoiser
    for path, delta in deltas.items():
        layer = root.get_submodule(path)
        torch.testing.assert_close(layer.get_delta_weight("default"), delta, atol=1e-6,
                                   rtol=1e-5)
