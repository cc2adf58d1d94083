"""fp8 base weights from an SD-family single file (model.base_precision = "fp8"): the UNet's
weights that fp8 storage holds stream from the file into fp8, never built at full width and
cast afterwards, equal what storing the full-width UNet in fp8 gives, and a LoRA trains on them.
"""

from __future__ import annotations

import pytest
import torch
from test_memory_fp8 import Upcasts
from test_models_single_file import BUILDERS, MODULES, write
from train_helpers import one_image_dataset, randomize, small_config

from trainer.config import ModelSection
from trainer.events import ListSink, Log, Step
from trainer.families.sd.tiny import save_tiny_model
from trainer.models import streamed_load
from trainer.models.loader import load_base_model
from trainer.models.memory import FP8, fp8_parameter_names, store_fp8, to_compute_dtype
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> (folder with configs and tokenizers, randomized modules)."""
    root = tmp_path_factory.mktemp("fp8-sd")
    out = {}
    for family in ("sd1", "sdxl"):
        parts = BUILDERS[family]()
        modules = {k: randomize(parts[k], i) for i, k in enumerate(MODULES) if k in parts}
        out[family] = (save_tiny_model(root / family, family=family), modules)
    return out


def _load(path, folder, base="full", dtype=None):
    section = ModelSection(pretrained_model_name_or_path=str(path), config_dir=str(folder),
                           tokenizer=str(folder), base_precision=base)
    return load_base_model(section, dtype)


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
@pytest.mark.parametrize("shipped", [FP8, torch.float16])
def test_the_unet_streams_into_fp8_and_equals_the_unet_stored_afterwards(
        tiny, tmp_path, monkeypatch, family, shipped):
    folder, modules = tiny[family]
    path = write(tmp_path / "m.safetensors", family, modules, shipped)
    monkeypatch.setattr(streamed_load, "GROUP_BYTES", 4096)  # many groups on a tiny model
    wide, real_fill = [], streamed_load.fill

    def fill(model, tensors, names, *args, **kwargs):
        real_fill(model, tensors, names, *args, **kwargs)
        wide.append(sum(t.numel() for n, t in model.named_parameters()
                        if n in names and t.device.type != "meta" and t.dtype != FP8))

    monkeypatch.setattr(streamed_load, "fill", fill)
    with Upcasts() as upcasts:
        got = _load(path, folder, "fp8", torch.bfloat16).unet
    assert len(wide) > 10 and max(wide) == 0  # each group's stored weights fp8 on arrival
    stored = fp8_parameter_names(got)
    if shipped == FP8:  # only what stays at full width was upcast (UNet, VAE, text encoders)
        others = sum(t.numel() for part in modules if part != "unet"
                     for t in modules[part].parameters())
        unstored = sum(t.numel() for n, t in got.named_parameters() if n not in stored)
        assert 0 < upcasts.elements <= unstored + others
    assert all(got.get_submodule(n.rpartition(".")[0])._fp8_copies for n in stored)  # hooks
    monkeypatch.undo()
    want = _load(path, folder).unet  # the path before: built in fp32, stored by the run
    to_compute_dtype(want, torch.bfloat16)
    store_fp8(want.requires_grad_(False), torch.bfloat16)
    a, b = got.state_dict(), want.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        x, y = (t.view(torch.uint8) if t.dtype == FP8 else t for t in (a[key], b[key]))
        assert torch.equal(x, y), key
    assert sum(t.dtype == FP8 for t in a.values()) > len(a) // 2
    assert got.conv_in.weight.dtype == torch.bfloat16  # kept at the compute precision


def test_a_lora_trains_on_the_unet_stored_at_the_load(tiny, tmp_path, monkeypatch):
    from trainer.methods.lora import LoraMethod

    folder, modules = tiny["sdxl"]
    path = write(tmp_path / "m.safetensors", "sdxl", modules, torch.float16)
    one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path / "run", tmp_path / "data",
                       model={"pretrained_model_name_or_path": str(path),
                              "config_dir": str(folder), "tokenizer": str(folder),
                              "base_precision": "fp8"},
                       training={"max_train_steps": 2, "mixed_precision": "bf16"})
    casts, real_store = [], store_fp8

    def store(module, dtype, *args):
        arrived = any(p.dtype == FP8 for p in module.parameters())  # before the hooks
        count = real_store(module, dtype, *args)
        casts.append((arrived, count))
        return count

    seen = {}
    real_save = LoraMethod.save

    def save(self, out, model, facts, final=True):
        seen["unet"] = model.unet.state_dict()
        return real_save(self, out, model, facts, final)

    monkeypatch.setattr("trainer.models.memory.store_fp8", store)
    monkeypatch.setattr(LoraMethod, "save", save)
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    losses = [e.loss for e in sink.events if isinstance(e, Step)]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    # the weights arrived in fp8 (the hooks installed at the load), and nothing cast later
    assert casts[0][0] and casts[0][1] > 0 and not any(count for _, count in casts[1:])
    lora = [v for k, v in seen["unet"].items() if ".lora_B." in k]
    assert lora and any(v.abs().max() > 0 for v in lora)  # the adapters trained
    assert all(v.dtype == torch.float32 for k, v in seen["unet"].items() if ".lora_" in k)
    assert all(v.dtype == FP8 for k, v in seen["unet"].items() if k.endswith(
        "to_q.base_layer.weight"))  # the frozen weights under the adapters: still fp8
    assert any("stored in fp8" in e.message for e in sink.events if isinstance(e, Log))
