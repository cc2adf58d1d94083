"""LyCORIS on the transformer families (issue 32): LoCon, LoHa and LoKr train on the tiny FLUX.1,
and ComfyUI, by its own rules written out here, maps every key of the file and adds to FLUX.1's
original (BFL) weights exactly what the trained network adds to diffusers' layers.

The ComfyUI side, reimplemented from xmarre/ComfyUI (6d4f9e86): ``model_lora_keys_unet``'s FLUX
branch maps ``lycoris_`` + a diffusers path (``flux_to_diffusers`` in comfy/utils.py) onto a BFL
weight, a split layer onto its rows of the fused one (an offset); ``model_lora_keys_clip`` maps
CLIP-L's ``lora_te1_text_model_encoder_layers_N_<LORA_CLIP_MAP>``; ``load_lora`` consumes
``alpha`` and the adapter's tensors; ``calculate_weight`` narrows the weight to the offset and the
adapter (comfy/weight_adapter/lora.py, loha.py, lokr.py) adds its update there. What the network
adds is read from its forward pass (each adapted Linear on the identity), not from its tensors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink
from trainer.methods.lycoris import LycorisMethod
from trainer.run.loop import run

FLUX = "embedded:tiny-flux"
# network_dim 2 makes lycoris factor LoKr's w2 (lokr_w2_a @ lokr_w2_b, scaled alpha / rank) on
# the tiny widths; at 4 it keeps both factors whole (scale 1)
NETWORKS = {"locon": {"network_dim": 4}, "loha": {"network_dim": 4},
            "lokr": {"network_dim": 2, "train_text_encoder": True, "train_t5xxl": True}}
_RUNS: dict[str, tuple] = {}

# ComfyUI's flux_to_diffusers, weights: diffusers module of a double block -> BFL module
DOUBLE_WHOLE = {"attn.to_out.0": "img_attn.proj", "norm1.linear": "img_mod.lin",
                "norm1_context.linear": "txt_mod.lin", "attn.to_add_out": "txt_attn.proj",
                "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2",
                "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2"}
SINGLE_WHOLE = {"norm.linear": "modulation.lin", "proj_out": "linear2"}
# its entries for FLUX.2's diffusers names ("LyCoris LoKr", "Flux 2")
DOUBLE_FLUX2 = {"ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
                "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}
SINGLE_FLUX2 = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
LORA_CLIP_MAP = {"mlp.fc1": "mlp_fc1", "mlp.fc2": "mlp_fc2", "self_attn.k_proj": "self_attn_k_proj",
                 "self_attn.q_proj": "self_attn_q_proj", "self_attn.v_proj": "self_attn_v_proj",
                 "self_attn.out_proj": "self_attn_out_proj"}
# comfy/weight_adapter: the tensors each adapter's load() takes
ADAPTER_KEYS = {"lora": ("lora_up.weight", "lora_down.weight", "lora_mid.weight"),
                "loha": ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"),
                "lokr": ("lokr_w1", "lokr_w2", "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b",
                         "lokr_t2")}


def flux_to_diffusers(depth: int, depth_single: int, hidden: int) -> dict:
    """ComfyUI's ``flux_to_diffusers`` (comfy/utils.py), its Linear weights: diffusers module
    path -> (BFL weight, (dim, start, rows) or None). FLUX.2 (a ``Flux`` there) reads the
    entries of its own diffusers names (``ff.linear_in``, ``attn.to_qkv_mlp_proj``...)."""
    out = {}
    for i in range(depth):
        d, b = f"transformer_blocks.{i}", f"double_blocks.{i}"
        for j, p in enumerate(("to_q", "to_k", "to_v")):
            out[f"{d}.attn.{p}"] = (f"{b}.img_attn.qkv.weight", (0, j * hidden, hidden))
        for j, p in enumerate(("add_q_proj", "add_k_proj", "add_v_proj")):
            out[f"{d}.attn.{p}"] = (f"{b}.txt_attn.qkv.weight", (0, j * hidden, hidden))
        out.update({f"{d}.{k}": (f"{b}.{v}.weight", None)
                    for k, v in {**DOUBLE_WHOLE, **DOUBLE_FLUX2}.items()})
    for i in range(depth_single):
        s, b = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        for j, p in enumerate(("to_q", "to_k", "to_v")):
            out[f"{s}.attn.{p}"] = (f"{b}.linear1.weight", (0, j * hidden, hidden))
        out[f"{s}.proj_mlp"] = (f"{b}.linear1.weight", (0, hidden * 3, hidden * 4))
        out.update({f"{s}.{k}": (f"{b}.{v}.weight", None)
                    for k, v in {**SINGLE_WHOLE, **SINGLE_FLUX2}.items()})
    return out


def comfy_flux_map(depth: int, depth_single: int, hidden: int) -> dict:
    """ComfyUI's Flux branch of ``model_lora_keys_unet``, its ``lycoris_`` names: name ->
    ((BFL weight, offset or None), diffusers path)."""
    return {"lycoris_" + k.replace(".", "_"): (v, k)
            for k, v in flux_to_diffusers(depth, depth_single, hidden).items()}


def comfy_clip_map(layers: int) -> dict:
    return {f"lora_te1_text_model_encoder_layers_{b}_{v}": (
        (f"clip_l.transformer.text_model.encoder.layers.{b}.{k}.weight", None),
        f"encoder.layers.{b}.{k}") for b in range(layers) for k, v in LORA_CLIP_MAP.items()}


def comfy_t5_map(t5_keys, index: int = 3) -> dict:
    """ComfyUI's T5 names (``model_lora_keys_clip``): ``lora_te<index>_`` + the module path of
    its ``t5xxl.transformer.`` weights, which are transformers' T5 encoder's; the index is 3
    beside CLIP-L and no CLIP-G (FLUX.1), 1 for a T5 alone (Chroma)."""
    return {f"lora_te{index}_" + k[:-len(".weight")].replace(".", "_"): (
        (f"t5xxl.transformer.{k}", None), k[:-len(".weight")])
        for k in t5_keys if k.endswith(".weight")}


def comfy_load(tensors: dict) -> tuple[dict, set]:
    """ComfyUI's load_lora over the file's module names: name -> (adapter, its tensors,
    alpha); and the keys it consumed."""
    names = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0]
             for k in tensors}
    patches, used = {}, set()
    for x in names:
        alpha = tensors.get(f"{x}.alpha")
        if alpha is not None:
            used.add(f"{x}.alpha")
        for kind, keys in ADAPTER_KEYS.items():
            own = {k: tensors[f"{x}.{k}"].double() for k in keys if f"{x}.{k}" in tensors}
            if own:
                patches[x] = (kind, own, None if alpha is None else alpha.item())
                used.update(f"{x}.{k}" for k in own)
                break
    return patches, used


def comfy_diff(kind: str, t: dict, alpha, shape) -> torch.Tensor:
    """The update ComfyUI's adapter adds (strength 1): lora.py, loha.py, lokr.py."""
    if kind == "lora":
        scale = 1.0 if alpha is None else alpha / t["lora_down.weight"].shape[0]
        diff = t["lora_up.weight"].flatten(1) @ t["lora_down.weight"].flatten(1)
        return scale * diff.reshape(shape)
    if kind == "loha":
        scale = 1.0 if alpha is None else alpha / t["hada_w1_b"].shape[0]
        diff = (t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"])
        return scale * diff.reshape(shape)
    dim, w1, w2 = None, t.get("lokr_w1"), t.get("lokr_w2")
    if w1 is None:
        dim, w1 = t["lokr_w1_b"].shape[0], t["lokr_w1_a"] @ t["lokr_w1_b"]
    if w2 is None:
        dim, w2 = t["lokr_w2_b"].shape[0], t["lokr_w2_a"] @ t["lokr_w2_b"]
    scale = alpha / dim if alpha is not None and dim is not None else 1.0
    return scale * torch.kron(w1, w2).reshape(shape)


def assert_comfyui_adds(tensors: dict, key_map: dict, updates: dict,
                       shape: Callable[[str, torch.Tensor], tuple]) -> dict:
    """ComfyUI loads every key of the file (no "lora key not loaded"), maps every module
    (``key_map``: name -> ((weight, offset or None), (component, path))), and its adapters,
    applied to the mapped weights (``shape(weight, update)``; zero here, so the sum is the
    update alone) in their rows, add exactly what each trained layer adds. Returns the
    patches (name -> (adapter, tensors, alpha))."""
    patches, used = comfy_load(tensors)
    assert set(tensors) == used
    assert set(patches) <= set(key_map), sorted(set(patches) - set(key_map))[:5]
    assert len(patches) == len(updates)  # one file module per adapted layer
    fused: dict[str, torch.Tensor] = {}  # the original weights' updates, as ComfyUI patches them
    for name, (kind, own, alpha) in patches.items():
        (weight, offset), place = key_map[name]
        want = updates[place]
        total = fused.setdefault(weight, torch.zeros(shape(weight, want), dtype=torch.float64))
        rows = total.narrow(*offset) if offset else total
        rows += comfy_diff(kind, own, alpha, rows.shape)
        torch.testing.assert_close(rows, want, rtol=1e-4, atol=1e-6)
    assert any(u.abs().max() > 1e-6 for u in updates.values())  # the adapters trained
    return patches


@torch.no_grad()
def network_updates(model, loras) -> dict:
    """(component, module path) -> what each adapted Linear adds to its weight, read from its
    forward pass on the identity (adapted minus the frozen layer's own forward)."""
    places = {}
    for component in ("denoiser", "text_encoder", "text_encoder_2"):
        for path, module in getattr(getattr(model, component, None), "named_modules",
                                    lambda: [])():
            places.setdefault(id(module), (component, path.removeprefix("text_model.")))
    out = {}
    for lora in loras:
        layer = lora.org_module[0]
        eye = torch.eye(layer.in_features, dtype=layer.weight.dtype)
        out[places[id(layer)]] = (layer(eye) - lora.org_forward(eye)).T.double()
    return out


def trained(tmp_path_factory, network_type: str, model: str = FLUX,
            network: Optional[dict] = None, training: Optional[dict] = None):
    """(config, output file, the network's updates at the final save) of a 2-step run of
    ``network_type`` on ``model`` (``network``: its settings, default :data:`NETWORKS`')."""
    if (model, network_type) not in _RUNS:
        root = tmp_path_factory.mktemp(network_type)
        network = {"network_type": network_type, "network_alpha": 2.0,
                   **(NETWORKS[network_type] if network is None else network)}
        cfg = small_config(root, one_image_dataset(root / "data"), network=network,
                           model={"pretrained_model_name_or_path": model},
                           training={"max_train_steps": 2, **(training or {})},
                           optimizer={"learning_rate": 1e-2})
        updates = []
        save = LycorisMethod.save

        def capture(self, path, model, facts, final=True):
            updates.append(network_updates(model, self.loras))
            return save(self, path, model, facts, final)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(LycorisMethod, "save", capture)
            result = run(cfg, ListSink())
        assert result.status == "finished", result.error
        _RUNS[model, network_type] = (cfg, result.output_path, updates[-1])
    return _RUNS[model, network_type]


def tiny_configs():
    """The tiny FLUX.1's transformer and CLIP-L configs, and its T5's weight names."""
    from diffusers import FluxTransformer2DModel
    from safetensors import safe_open
    from transformers import CLIPTextConfig

    from trainer.models.loader import resolve_model_path

    folder = resolve_model_path(FLUX)
    with safe_open(next((folder / "text_encoder_2").glob("*.safetensors")), "pt") as f:
        t5_keys = list(f.keys())
    return (FluxTransformer2DModel.load_config(folder / "transformer"),
            CLIPTextConfig.from_pretrained(folder / "text_encoder"), t5_keys)


@pytest.mark.parametrize("network_type", list(NETWORKS))
def test_comfyui_maps_every_key_and_adds_the_trained_update(tmp_path_factory, network_type):
    cfg, path, updates = trained(tmp_path_factory, network_type)
    tensors = load_file(path)
    c, clip, t5_keys = tiny_configs()
    c = SimpleNamespace(**c)
    hidden = c.num_attention_heads * c.attention_head_dim
    key_map = {name: (target, (component, path_)) for component, part in (
        ("denoiser", comfy_flux_map(c.num_layers, c.num_single_layers, hidden)),
        ("text_encoder", comfy_clip_map(clip.num_hidden_layers)),
        ("text_encoder_2", comfy_t5_map(t5_keys))) for name, (target, path_) in part.items()}

    def shape(bfl, update):  # FLUX.1's fused rows: q, k, v (3 x hidden) and the 4 x MLP
        fused = hidden * 7 if bfl.endswith("linear1.weight") else hidden * 3
        return (fused, update.shape[1]) if bfl.endswith("qkv.weight") or fused == hidden * 7 \
            else tuple(update.shape)

    patches = assert_comfyui_adds(tensors, key_map, updates, shape)
    assert {kind for kind, _, _ in patches.values()} == {"locon": {"lora"}}.get(
        network_type, {network_type})
    if NETWORKS[network_type].get("train_text_encoder"):  # lokr: CLIP-L, T5, factored w2
        assert any(n.startswith("lora_te1_") for n in patches)
        assert any(n.startswith("lora_te3_") for n in patches)
        assert any(k.endswith(".lokr_w2_a") for k in tensors)


@pytest.mark.parametrize("network_type", ["locon", "lokr"])
def test_metadata_and_tools_inspect(tmp_path_factory, network_type):
    from trainer.tools.inspect import inspect
    from trainer.tools.options import InspectOptions

    _, path, updates = trained(tmp_path_factory, network_type)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "lycoris.kohya"
    assert json.loads(meta["ss_network_args"])["algo"] == network_type
    assert meta["ss_base_model_version"] == "flux1"
    assert meta["modelspec.architecture"] == "flux-1-dev/lora" and meta["ss_model_type"] == "flux"
    report = inspect(InspectOptions(path=path))
    kind = {"locon": "LoRA", "lokr": "LoKr"}[network_type]
    assert report.network_type == f"LyCORIS ({network_type}): {kind}"
    assert report.family == "flux1"
    assert report.parts()["transformer"] == sum(c == "denoiser" for c, _ in updates)
    assert not report.unknown_keys


@pytest.mark.parametrize("network_type", ["loha", "lokr"])
def test_tools_merge_adds_the_trained_update(tmp_path_factory, tmp_path, network_type):
    """tools merge reads the ``lycoris_`` names: the merged diffusers folder's layers are the
    base's plus what the trained network added."""
    from diffusers import FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    from trainer.models.loader import resolve_model_path
    from trainer.tools.merge import merge
    from trainer.tools.options import MergeOptions

    _, path, updates = trained(tmp_path_factory, network_type)
    base = resolve_model_path(FLUX)
    report = merge(MergeOptions(base=str(base), loras=[path], save_folder=str(tmp_path / "m"),
                                precision="fp32"))
    assert not report.loras[0].unmatched and report.loras[0].applied == len(updates)
    models = {"denoiser": FluxTransformer2DModel, "text_encoder": CLIPTextModel,
              "text_encoder_2": T5EncoderModel}
    folders = {"denoiser": "transformer", "text_encoder": "text_encoder",
               "text_encoder_2": "text_encoder_2"}
    for component in {c for c, _ in updates}:
        before, after = (models[component].from_pretrained(root / folders[component])
                         for root in (base, tmp_path / "m"))
        for (c, module_path), want in updates.items():
            if c != component:
                continue
            prefix = "text_model." if c == "text_encoder" and not hasattr(
                before, "encoder") else ""
            old, new = (m.get_submodule(prefix + module_path).weight.double()
                        for m in (before, after))
            torch.testing.assert_close(new - old, want, rtol=1e-4, atol=1e-6)


def test_network_weights_continue_from_the_file(tmp_path_factory, tmp_path):
    """network.network_weights loads every module of the file back: the network then adds
    what the trained one added; a run continues from it."""
    from trainer.models.loader import load_base_model

    cfg, path, updates = trained(tmp_path_factory, "lokr")
    again = cfg.model_copy(update={"network": cfg.network.model_copy(
        update={"network_weights": path}), "training": cfg.training.model_copy(
        update={"max_train_steps": 1})})
    model = load_base_model(again.model)
    method = LycorisMethod(again)
    method.prepare(model)
    loaded = network_updates(model, method.loras)
    assert loaded.keys() == updates.keys()
    for key, want in updates.items():
        torch.testing.assert_close(loaded[key], want, rtol=1e-5, atol=1e-7)
    again = again.model_copy(update={"saving": again.saving.model_copy(
        update={"output_dir": str(tmp_path / "out")})})
    result = run(again, ListSink())
    assert result.status == "finished", result.error


def test_diffusers_flux_pipeline_applies_no_lycoris_file(tmp_path_factory):
    """diffusers 0.42's FluxPipeline.load_lora_weights reads no LyCORIS file of FLUX.1 (it
    loads nothing, with a warning): the README says so; ComfyUI is the reader."""
    from diffusers import FluxPipeline

    from trainer.models.loader import resolve_model_path

    _, path, _ = trained(tmp_path_factory, "lokr")
    pipe = FluxPipeline.from_pretrained(resolve_model_path(FLUX))
    pipe.load_lora_weights(path)
    assert pipe.get_list_adapters() == {}


def test_sd3_lokr_trains_under_comfyui_names(tmp_path):
    """SD 3.5: the transformer's modules as ComfyUI's SD3 branch maps ``lycoris_`` names
    (``mmdit_to_diffusers``: the joint blocks' diffusers paths, attn2's q/k/v too)."""
    from test_export_sd3_lora import COMFY_MAPPED

    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       model={"pretrained_model_name_or_path": "embedded:tiny-sd3"},
                       network={"network_type": "lokr", "network_dim": 2},
                       training={"max_train_steps": 2})
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    names = {k.split(".")[0] for k in load_file(result.output_path)}
    mapped = {f"lycoris_transformer_blocks_{i}_{m.replace('.', '_')}" for i in range(2)
              for m in (*COMFY_MAPPED, "attn2.to_q", "attn2.to_k", "attn2.to_v",
                        "attn2.to_out.0")}
    assert names and names <= mapped, sorted(names - mapped)[:5]


@pytest.mark.parametrize("network, message", [
    ({"network_type": "ia3"}, "'ia3' is not available for FLUX.1"),
    ({"network_type": "dora"}, "'dora' is not available for FLUX.1"),
    ({"network_type": "lokr", "lycoris_preset": "attn-only"}, "unset lycoris_preset"),
])
def test_what_flux_lycoris_cannot_do_is_refused(network, message):
    from trainer.config import TrainConfig

    with pytest.raises(ValueError, match=message):
        TrainConfig.model_validate({"model": {"pretrained_model_name_or_path": FLUX},
                                    "network": network})


def test_every_transformer_family_with_lycoris_names_its_modules():
    """The contract of FamilySpec.lycoris on a transformer: its lora role answers the targets
    and the file's names (trainer/export/flow_lycoris.py)."""
    from trainer.families import FAMILIES, role

    for name, s in FAMILIES.items():
        if s.denoiser == "transformer" and s.lycoris:
            lora = role(name, "lora")
            assert callable(lora.target_modules) and callable(lora.lycoris_module_name), name


@pytest.mark.parametrize("lora_type, network_type", [("LyCORIS/LoKr", "lokr"),
                                                     ("LyCORIS/LoHa", "loha")])
def test_a_kohya_ss_flux_lycoris_config_imports(lora_type, network_type):
    """kohya_ss saves conv_dim / conv_alpha with every LyCORIS type; FLUX.1's transformer has no
    3x3 convolution, so they are reported as not needed rather than refused."""
    from test_import_kohya_flow import FLOW, reasons
    from test_import_kohya_flow import FLUX as FLUX_PRESET

    from trainer.importers.kohya import import_kohya

    data = {**FLOW[FLUX_PRESET], "LoRA_type": lora_type, "conv_dim": 4, "conv_alpha": 1,
            "LyCORIS_preset": "full", "factor": -1}
    cfg, report = import_kohya(data, source="flux lycoris")
    assert (cfg.model.model_version, cfg.network.network_type) == ("flux1", network_type)
    assert cfg.network.conv_dim is None
    assert "no 3x3 convolution" in reasons(report)["conv_dim"]
