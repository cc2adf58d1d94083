"""Single files without the double copy (issue 20): the UNet, the VAE and the CLIP text encoders
are filled tensor by tensor from the file, never as a whole dict of the component's tensors,
and load the same weights; a conversion that computes tensors falls back to the dict."""


import pytest
import torch
from test_models_single_file import BUILDERS, MODULES, assert_same_weights, load, write
from train_helpers import randomize

from trainer.families.sd import single_file
from trainer.families.sd.tiny import save_tiny_model
from trainer.models import streamed_load


@pytest.fixture(scope="module")
def sd1(tmp_path_factory):
    root = tmp_path_factory.mktemp("streamed")
    parts = BUILDERS["sd1"]()
    modules = {k: randomize(parts[k], i) for i, k in enumerate(MODULES) if k in parts}
    folder = save_tiny_model(root / "sd1", family="sd1")
    return folder, modules, write(root / "half.safetensors", "sd1", modules, torch.float16)


def test_every_part_streams_in_small_groups(sd1, monkeypatch):
    folder, modules, path = sd1
    monkeypatch.setattr(single_file.Checkpoint, "take",
                        lambda self, prefix: pytest.fail(f"{prefix} read as a whole dict"))
    monkeypatch.setattr(streamed_load, "GROUP_BYTES", 4096)
    largest = []
    original = streamed_load.SafetensorsReader.read
    group_sizes = []

    def read(self, key):
        tensor = original(self, key)
        largest.append(tensor.numel() * tensor.element_size())
        return tensor

    monkeypatch.setattr(streamed_load.SafetensorsReader, "read", read)
    real_groups = streamed_load._groups
    monkeypatch.setattr(streamed_load, "_groups", lambda d: (
        group_sizes.append(len(g)) or g for g in real_groups(d)))
    model = load(path, folder)
    assert_same_weights(model, modules, lambda t: t.half().float())
    assert len(largest) > 400 and len(group_sizes) > 20  # tensor by tensor, in many groups
    assert max(group_sizes) < len(largest) / 10


def test_a_computed_tensor_falls_back_to_the_whole_dict(sd1, monkeypatch):
    folder, modules, path = sd1
    real = streamed_load._resolve_check
    monkeypatch.setattr(streamed_load, "_resolve_check", lambda v, ids: True)
    monkeypatch.setattr(streamed_load.Recorder, "knows", lambda self, v: False)
    model = load(path, folder)
    assert_same_weights(model, modules, lambda t: t.half().float())
    monkeypatch.setattr(streamed_load, "_resolve_check", real)


def test_a_view_of_a_file_tensor_reads_as_the_same_view(tmp_path):
    from safetensors.torch import save_file

    weight = torch.arange(24, dtype=torch.float16).reshape(2, 3, 4)
    save_file({"w": weight}, str(tmp_path / "f.safetensors"))
    reader = streamed_load.SafetensorsReader(tmp_path / "f.safetensors")
    meta = reader.meta(["w"])
    ids = {id(meta["w"]): "w"}
    for view in (lambda t: t[:, 1], lambda t: t.transpose(0, 2), lambda t: t.reshape(6, 4)):
        assert torch.equal(streamed_load._resolve(view(meta["w"]), ids, reader), view(weight))
    assert streamed_load._resolve_check(meta["w"] * 2, ids)


@pytest.mark.parametrize("family", ["sd2", "sdxl"])
def test_openclip_text_encoders_stream_with_the_same_weights(tmp_path, family, monkeypatch):
    """SD 2.x's OpenCLIP and SDXL's bigG: q/k/v cut from in_proj_weight with clone() and the
    transposed projection are rebuilt from the file tensor, bit for bit (issue 20)."""
    parts = BUILDERS[family]()
    modules = {k: randomize(parts[k], i) for i, k in enumerate(MODULES) if k in parts}
    folder = save_tiny_model(tmp_path / family, family=family)
    path = write(tmp_path / "half.safetensors", family, modules, torch.float16)
    monkeypatch.setattr(single_file.Checkpoint, "take",
                        lambda self, prefix: pytest.fail(f"{prefix} read as a whole dict"))
    replayed = []
    real_replay = streamed_load.Recorder.replay
    monkeypatch.setattr(streamed_load.Recorder, "replay", lambda self, v, read: (
        replayed.append(tuple(v.shape)) or real_replay(self, v, read)))
    model = load(path, folder)
    assert_same_weights(model, modules, lambda t: t.half().float())
    assert replayed  # the OpenCLIP encoder's computed tensors were streamed, not the dict


def test_a_recipe_replays_clone_and_contiguous_on_the_real_tensor(tmp_path):
    from safetensors.torch import save_file

    weight = torch.randn(6, 4).half()
    save_file({"w": weight}, str(tmp_path / "f.safetensors"))
    reader = streamed_load.SafetensorsReader(tmp_path / "f.safetensors")
    meta = reader.meta(["w"])
    ids = {id(meta["w"]): "w"}
    recorder = streamed_load.Recorder(set(ids))
    with recorder:
        q = meta["w"][:2, :].clone().detach()
        proj = meta["w"].T.contiguous()
        scaled = meta["w"] * 2
    for value, expected in ((q, weight[:2]), (proj, weight.T.contiguous()),
                            (scaled, weight * 2)):
        real = streamed_load._resolve(value, ids, reader, recorder)
        assert torch.equal(real, expected) and real.dtype == torch.float16


def test_a_large_file_tensor_is_read_into_pages_that_go_back_when_it_is_dropped(tmp_path):
    """A file tensor of MAPPED_BYTES or more is read into a memory map of its own, unmapped
    when the tensor goes: read into the malloc heap, the fp16 copies of an SD 1.5 file left
    holes between the fp32 weights built from them, which the process kept (0.12 GiB)."""
    from safetensors.torch import save_file

    size = streamed_load.MAPPED_BYTES
    save_file({"big": torch.arange(size // 2, dtype=torch.float16), "small": torch.ones(8)},
              str(tmp_path / "f.safetensors"))
    reader = streamed_load.SafetensorsReader(tmp_path / "f.safetensors")
    big = reader.read("big")
    assert torch.equal(big, torch.arange(size // 2, dtype=torch.float16))
    start = big.data_ptr()
    assert start in _mapping_starts()  # the tensor's pages are a mapping of their own
    del big
    assert start not in _mapping_starts()  # and unmapped with it
    assert torch.equal(reader.read("small"), torch.ones(8))


def _mapping_starts() -> set[int]:
    with open("/proc/self/maps") as maps:
        return {int(line.split("-", 1)[0], 16) for line in maps}


def test_a_casts_intermediate_lives_in_pages_of_its_own():
    """fp8 storage casts a file's fp16 tensor by way of the compute dtype: that intermediate
    too is a mapping of its own, gone with it (in the heap it left 1.3 GiB of holes between an
    SDXL UNet's fp8 weights)."""
    source = torch.randn(streamed_load.MAPPED_BYTES // 2).half()
    wide = streamed_load.scratch(source, torch.bfloat16)
    assert torch.equal(wide, source.to(torch.bfloat16))
    start = wide.data_ptr()
    assert start in _mapping_starts()
    del wide
    assert start not in _mapping_starts()
    small = source[:8]
    assert streamed_load.scratch(small, torch.float16) is small
