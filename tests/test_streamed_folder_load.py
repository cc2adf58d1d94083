"""A diffusers folder's models without the double copy: diffusers' ``from_pretrained`` took a
model's .safetensors file as a whole state dict (the file mapped in full), so a bf16
transformer loaded in fp32 held the whole file's pages beside the fp32 model (a Z-Image at
real width: 3.67 GB against 2.59 GB loaded). The loader's folder loads (every family's, and a
deferred denoiser's) now read each tensor from the file as diffusers sets it; diffusers' own
semantics stay (the dtype, ``_keep_in_fp32_modules``, shards)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers.models import model_loading_utils
from safetensors.torch import load_file

from trainer.config.sections.model import ModelSection
from trainer.models import streamed_load
from trainer.models.loader import load_base_model

pytestmark = pytest.mark.usefixtures("no_network")


def mapped_files(under: list[Path]) -> set[str]:
    """The .safetensors files in ``under`` that this process maps (/proc/self/maps): a mapped
    file's pages stay resident, once touched, for as long as it is mapped."""
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        name = line.split(maxsplit=5)[-1]
        if name.endswith(".safetensors") and any(name.startswith(str(f)) for f in under):
            found.add(name)
    return found


@pytest.fixture
def bf16_zimage(tmp_path):
    """The tiny Z-Image folder with its transformer stored in bf16 (as the released one)."""
    from diffusers import ZImageTransformer2DModel

    from trainer.families.zimage.tiny import save_tiny_zimage

    folder = save_tiny_zimage(tmp_path / "zimage")
    transformer = ZImageTransformer2DModel.from_pretrained(folder / "transformer")
    transformer.to(torch.bfloat16).save_pretrained(folder / "transformer")
    return folder


def spy_on_fill(monkeypatch, folders: list[Path]) -> list[set[str]]:
    """Which files of ``folders`` are mapped each time diffusers sets one of a model's weights."""
    seen: list[set[str]] = []
    real = model_loading_utils.set_module_tensor_to_device

    def spy(*args, **kwargs):
        seen.append(mapped_files(folders))
        return real(*args, **kwargs)

    monkeypatch.setattr(model_loading_utils, "set_module_tensor_to_device", spy)
    return seen


@pytest.mark.parametrize("deferred", [False, True], ids=["with-pipeline", "text-first"])
def test_a_folders_transformer_is_filled_with_its_file_never_mapped_whole(
        bf16_zimage, monkeypatch, deferred):
    seen = spy_on_fill(monkeypatch, [bf16_zimage / "transformer", bf16_zimage / "vae"])
    model = load_base_model(ModelSection(pretrained_model_name_or_path=str(bf16_zimage)),
                            torch.float32, defer_denoiser=deferred)
    if deferred:
        assert model.denoiser is None
        model.denoiser = model.build_denoiser(torch.float32)
    assert len(seen) > 100  # the transformer's and the VAE's weights, one by one
    assert [m for m in seen if m] == []  # no file of the folder mapped while they are set
    stored = load_file(bf16_zimage / "transformer" / "diffusion_pytorch_model.safetensors")
    weights = model.denoiser.state_dict()
    assert weights.keys() == stored.keys()
    for key, tensor in stored.items():
        assert weights[key].dtype == torch.float32, key
        assert torch.equal(weights[key], tensor.float()), key


def test_each_file_tensor_is_read_when_taken_and_held_by_nobody_else(bf16_zimage, monkeypatch):
    """At most one of the file's tensors read and not yet set is alive at a time (the
    whole-file state dict held them all until the model was filled)."""
    import weakref

    alive: list[weakref.ref] = []
    most = [0]
    real_read = streamed_load.SafetensorsReader.read
    real_set = model_loading_utils.set_module_tensor_to_device

    def read(self, key):
        tensor = real_read(self, key)
        alive.append(weakref.ref(tensor))
        return tensor

    def count(*args, **kwargs):
        most[0] = max(most[0], sum(ref() is not None for ref in alive))
        return real_set(*args, **kwargs)

    monkeypatch.setattr(streamed_load.SafetensorsReader, "read", read)
    monkeypatch.setattr(model_loading_utils, "set_module_tensor_to_device", count)
    with streamed_load.streamed_folders():
        from diffusers import ZImageTransformer2DModel

        ZImageTransformer2DModel.from_pretrained(bf16_zimage, subfolder="transformer",
                                                 torch_dtype=torch.float32)
    assert len(alive) > 50 and most[0] <= 1


def tiny_wan():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2,
                                  attention_head_dim=8, in_channels=4, out_channels=4,
                                  text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
                                  rope_max_seq_len=32)
    for p in model.parameters():
        p.data.normal_()
    return model


@pytest.mark.parametrize("shard", [None, "8KB"], ids=["one-file", "shards"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_streamed_folders_load_as_diffusers_does(tmp_path, shard, dtype):
    """The same weights in the same dtypes as diffusers' own load, modules kept in fp32
    (``_keep_in_fp32_modules``) included, from one file or from shards."""
    from diffusers import WanTransformer3DModel

    kwargs = {"max_shard_size": shard} if shard else {}
    tiny_wan().to(torch.bfloat16).save_pretrained(tmp_path / "wan", **kwargs)
    files = list((tmp_path / "wan").glob("*.safetensors"))
    assert (len(files) == 1) if shard is None else (len(files) > 2), len(files)
    plain = WanTransformer3DModel.from_pretrained(tmp_path / "wan", torch_dtype=dtype)
    with streamed_load.streamed_folders():
        streamed = WanTransformer3DModel.from_pretrained(tmp_path / "wan", torch_dtype=dtype)
    ours, theirs = streamed.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys()
    kept = [k for k, t in theirs.items() if t.dtype != dtype]
    assert (dtype == torch.bfloat16) == bool(kept)  # diffusers kept some modules in fp32
    for key, tensor in theirs.items():
        assert ours[key].dtype == tensor.dtype, key
        assert torch.equal(ours[key], tensor), key


def test_a_file_the_reader_cannot_open_gets_diffusers_error(tmp_path):
    from diffusers import WanTransformer3DModel

    tiny_wan().save_pretrained(tmp_path / "wan")
    (tmp_path / "wan" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a file")
    with streamed_load.streamed_folders(), pytest.raises(OSError, match="Unable to load"):
        WanTransformer3DModel.from_pretrained(tmp_path / "wan")
