"""The LoRA tools and ``network.network_weights`` on the files the peers write for the newer
flow families (tests/tools_helpers.py builds them, one random LoRA in every form):

- Z-Image: musubi-tuner's kohya names on diffusers' layers (``lora_unet_layers_0_attention_to_q``
  + alpha), ai-toolkit's ``diffusion_model.layers.0.attention.to_q.lora_A/B`` (its ``layers``
  blocks' every Linear, the modulations too), diffusers' example's ``transformer.`` + the
  attention of every block (the refiners too), ours (ComfyUI's native names, fused ``qkv``);
- Qwen-Image: musubi-tuner's (= ours), ai-toolkit's, diffusers' example's;
- FLUX.2: musubi-tuner's BFL kohya names (a fused layer one dense LoRA), ai-toolkit's
  ``diffusion_model.<BFL path>.lora_A/B``, diffusers' example's ``transformer.<diffusers path>``
  (``to_q``.., ``single_transformer_blocks.0.attn.to_qkv_mlp_proj``), ours (block-diagonal);
- Chroma: sd-scripts' BFL kohya names, ai-toolkit's, the diffusers form, ours.

For each: inspect tells the family without metadata (but for the forms whose names and shapes
another family's files have too, :data:`AMBIGUOUS`: those are told by the metadata); merge
applies every module onto the base with the same update per layer as the other forms; resize
and extract write the family's own form (kohya names of the original layout that ComfyUI maps,
with alpha) with the same update; ``network.network_weights`` continues from it with the file's
update."""

from __future__ import annotations

import pytest
import torch
from tools_helpers import PEER_FORMS, PeerLora, file_modules
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.models.loader import load_base_model, resolve_model_path

pytestmark = pytest.mark.usefixtures("no_network")
TWINS = {"zimage": "embedded:tiny-zimage", "qwen_image": "embedded:tiny-qwen-image",
         "flux2": "embedded:tiny-flux2", "chroma": "embedded:tiny-chroma"}
CASES = [(f, form) for f in PEER_FORMS for form in PEER_FORMS[f]]
IDS = [f"{f}-{form}" for f, form in CASES]
RANK = 4
# the blocks a form's layers are in, for a network that continues from it
TRAIN_BLOCKS = {("zimage", "diffusers"): "with_refiners"}
# forms whose names and shapes other families' files have too: diffusers' names of the
# attention of an MMDiT block (``transformer.transformer_blocks.0.attn.to_q``: SD 3.5, FLUX.1,
# Chroma, Qwen-Image), FLUX.1's diffusers names (Chroma's blocks are FLUX.1's without their
# modulations, which diffusers' FLUX.1 example does not train either)
AMBIGUOUS = {("qwen_image", "diffusers"), ("chroma", "diffusers")}


def save(lora, family, form, path):
    """The form's file; an ambiguous one with the family's ``ss_base_model_version``."""
    from trainer.families import spec

    meta = {"ss_base_model_version": spec(family).kohya_version} \
        if (family, form) in AMBIGUOUS else None
    return lora.save(form, path, meta)


@pytest.fixture(scope="module")
def bases():
    return {}


def base_of(bases, family):
    if family not in bases:
        bases[family] = load_base_model(ModelSection(pretrained_model_name_or_path=TWINS[family]))
    return bases[family]


@pytest.fixture(scope="module")
def loras(bases):
    return {f: PeerLora(f, base_of(bases, f).denoiser, RANK) for f in PEER_FORMS}


def original_keys(family: str, transformer) -> set[str]:
    """The original layout's weight names (what ComfyUI's LoRA keys name)."""
    from trainer.families.chroma.checkpoint import chroma_tensors
    from trainer.families.flux2.checkpoint import bfl_tensors
    from trainer.families.zimage.checkpoint import native_tensors

    convert = {"zimage": native_tensors, "flux2": bfl_tensors, "chroma": chroma_tensors,
               "qwen_image": lambda t: t.state_dict()}[family]
    return set(convert(transformer))


def comfy_names(family: str, transformer) -> set[str]:
    """ComfyUI's generic LoRA names of the model (``lora_unet_`` + a native weight's path)."""
    return {"lora_unet_" + k[:-len(".weight")].replace(".", "_")
            for k in original_keys(family, transformer) if k.endswith(".weight")}


def merged_deltas(base, folder) -> dict[str, torch.Tensor]:
    """diffusers path -> merged weight minus the base's, of every Linear."""
    merged = load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
    before, after = base.denoiser.state_dict(), merged.denoiser.state_dict()
    return {k[:-len(".weight")]: after[k] - before[k] for k in before if k.endswith(".weight")}


def merge_into(family, path, folder):
    from trainer.tools.merge import merge
    from trainer.tools.options import MergeOptions

    return merge(MergeOptions(base=str(resolve_model_path(TWINS[family])), loras=[str(path)],
                              save_folder=str(folder), precision="fp32"))


def assert_updates(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]):
    for path, delta in got.items():
        torch.testing.assert_close(delta, want.get(path, torch.zeros_like(delta)), atol=2e-5,
                                   rtol=1e-4, msg=path)


@pytest.mark.parametrize("family", list(PEER_FORMS))
def test_the_forms_name_layers_of_the_original_layout(family, bases, loras):
    """The helper's tables fit the model: every fused name is a weight of the original layout
    whose rows are its parts'."""
    transformer = base_of(bases, family).denoiser
    keys = original_keys(family, transformer)
    units = loras[family].units
    assert units and all(u + ".weight" in keys for u in units)


@pytest.mark.parametrize("family,form", CASES, ids=IDS)
def test_inspect_tells_the_family_without_metadata(family, form, loras, tmp_path):
    from trainer.tools.inspect import inspect
    from trainer.tools.options import InspectOptions

    lora = loras[family]
    path = save(lora, family, form, tmp_path / f"{form}.safetensors")
    report = inspect(InspectOptions(path=str(path)))
    assert report.family == family, report.family_reason
    assert report.family_reason.startswith("from the metadata") == ((family, form) in AMBIGUOUS)
    assert len(report.modules) == len(file_modules(lora.tensors(form)))


@pytest.mark.parametrize("family,form", CASES, ids=IDS)
def test_merge_resize_and_extract(family, form, bases, loras, tmp_path):
    """merge: every module onto its layers, the form's update; resize (to the same rank) and
    extract (from the merged model) write the family's own form with the same update."""
    from safetensors.torch import load_file

    from trainer.tools.extract import extract
    from trainer.tools.options import ExtractOptions, ResizeOptions
    from trainer.tools.resize import resize

    lora, base = loras[family], base_of(bases, family)
    want = lora.deltas(form)
    path = save(lora, family, form, tmp_path / f"{form}.safetensors")
    report = merge_into(family, path, tmp_path / "merged")
    assert report.loras[0].unmatched == []
    assert report.loras[0].applied == len(file_modules(lora.tensors(form)))
    assert_updates(merged_deltas(base, tmp_path / "merged"), want)

    comfy = comfy_names(family, base.denoiser)
    resized = tmp_path / "resized.safetensors"
    resize(ResizeOptions(path=str(path), save_to=str(resized), rank=RANK, precision="fp32"))
    extracted = tmp_path / "extracted.safetensors"
    extract(ExtractOptions(base=str(resolve_model_path(TWINS[family])),
                           tuned=str(tmp_path / "merged"), rank=RANK, save_to=str(extracted),
                           precision="fp32"))
    for out in (resized, extracted):
        tensors = load_file(str(out))
        names = file_modules(tensors)
        assert names == lora.own_names(form), out.name
        assert names <= comfy and all(f"{n}.alpha" in tensors for n in names), out.name
        merge_into(family, out, tmp_path / f"{out.stem}-merged")
        assert_updates(merged_deltas(base, tmp_path / f"{out.stem}-merged"), want)


@pytest.mark.parametrize("family,form", CASES, ids=IDS)
def test_network_weights_continue_from_the_form(family, form, loras, tmp_path):
    """The network built with ``network.network_weights`` adds the file's update on every
    layer it trains that the file holds."""
    from trainer.methods.lora import LoraMethod

    lora = loras[family]
    path = lora.save(form, tmp_path / f"{form}.safetensors")
    network = {"network_dim": RANK, "network_alpha": 1.0, "network_weights": str(path)}
    if (family, form) in TRAIN_BLOCKS:
        network["train_blocks"] = TRAIN_BLOCKS[family, form]
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       model={"pretrained_model_name_or_path": TWINS[family]}, network=network)
    model = load_base_model(cfg.model)
    LoraMethod(cfg).prepare(model)
    want = lora.deltas(form)
    from trainer.export.lora import iter_lora_layers

    trained = dict(iter_lora_layers(model.denoiser))
    assert set(want) - {p for p in want if "adaLN" in p} <= set(trained)
    for p, layer in trained.items():
        if p in want:
            torch.testing.assert_close(layer.get_delta_weight("default"), want[p], atol=1e-5,
                                       rtol=1e-4, msg=p)


@pytest.mark.parametrize("prefix", ["lora_te1", "lora_te3"])  # ours (ComfyUI's), sd-scripts'
def test_chroma_t5_continues_from_ours_and_sd_scripts_names(prefix, bases, loras, tmp_path):
    """A Chroma file with T5 layers (ComfyUI names T5, its first text encoder, ``lora_te1_``;
    sd-scripts' FLUX.1 network writes ``lora_te3_``) continues into T5's LoRA too."""
    from safetensors.torch import save_file

    from trainer.export.lora import iter_lora_layers
    from trainer.methods.lora import T5_TARGETS, LoraMethod

    encoder = base_of(bases, "chroma").text_encoder
    gen = torch.Generator().manual_seed(7)
    tensors, want = loras["chroma"].tensors("sd-scripts"), {}
    for path, m in encoder.named_modules():
        if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in T5_TARGETS:
            down = torch.randn(RANK, m.in_features, generator=gen)
            up = torch.randn(m.out_features, RANK, generator=gen)
            name = f"{prefix}_{path.replace('.', '_')}"
            tensors.update({f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up,
                            f"{name}.alpha": torch.tensor(2.0)})
            want[path] = up @ down * (2.0 / RANK)
    path = tmp_path / "t5.safetensors"
    save_file(tensors, str(path), metadata={"ss_base_model_version": "chroma"})
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       model={"pretrained_model_name_or_path": TWINS["chroma"]},
                       network={"network_dim": RANK, "network_alpha": 1.0,
                                "network_weights": str(path), "train_text_encoder": True,
                                "train_t5xxl": True})
    model = load_base_model(cfg.model)
    LoraMethod(cfg).prepare(model)
    trained = dict(iter_lora_layers(model.text_encoder))
    assert want and set(want) <= set(trained)
    for p, delta in want.items():
        torch.testing.assert_close(trained[p].get_delta_weight("default"), delta, atol=1e-5,
                                   rtol=1e-4, msg=p)


@pytest.mark.parametrize("family", ["zimage", "flux2", "chroma"])
def test_a_part_saved_before_it_trained_keeps_its_rank(family, loras):
    """Our block-diagonal fused layer with one part's ``lora_up`` still zero (saved before that
    part trained) splits into each part's own rank, as the network that continues has it."""
    from trainer.families import role

    lora = loras[family]
    tensors = lora.tensors("ours")
    unit = next(u for u, paths in lora.units.items() if len(paths) == 3)
    name = "lora_unet_" + unit.replace(".", "_")
    rows = tensors[name + ".lora_up.weight"].shape[0] // 3
    tensors[name + ".lora_up.weight"][:rows] = 0
    split = role(family, "lora").network_weights_tensors(tensors)
    for path in lora.units[unit]:
        key = "lora_unet_" + path.replace(".", "_")
        assert split[key + ".lora_down.weight"].shape[0] == RANK, key
