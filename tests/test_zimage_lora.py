"""Z-Image LoRA files load where users load them: diffusers' ``ZImagePipeline.load_lora_weights``
reproduces the trained output, and ComfyUI maps every key of the file (no "lora key not
loaded"). ComfyUI's names are derived here from the native layout and ComfyUI's rules
(``comfy/utils.py`` ``z_image_to_diffusers``, ``comfy/lora.py`` ``model_lora_keys_unet``,
ComfyUI @ 3086026), not from our writer."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file, save_file

from trainer.families import family
from trainer.families.zimage.lora import kohya_tensors, target_modules
from trainer.families.zimage.tiny import build_zimage_components

pytestmark = pytest.mark.usefixtures("no_network")
RANK, ALPHA = 4, 2.0


def comfy_native_keys(config: dict) -> dict[str, str]:
    """ComfyUI's ``z_image_to_diffusers``: diffusers key -> native (ComfyUI) key or
    (native key, (dim, start, length)) for the fused q/k/v rows."""
    dim, key_map = config["dim"], {}

    def block(src: str, dst: str, adaln: bool) -> None:
        for end in ("weight", "bias"):
            qkv = f"{dst}.attention.qkv.{end}"
            for i, p in enumerate("qkv"):
                key_map[f"{src}.attention.to_{p}.{end}"] = (qkv, (0, i * dim, dim))
        names = {"attention.norm_q.weight": "attention.q_norm.weight",
                 "attention.norm_k.weight": "attention.k_norm.weight",
                 "attention.to_out.0.weight": "attention.out.weight",
                 "attention.to_out.0.bias": "attention.out.bias"}
        for same in ("attention_norm1.weight", "attention_norm2.weight", "ffn_norm1.weight",
                     "ffn_norm2.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                     "feed_forward.w3.weight"):
            names[same] = same
        if adaln:
            names.update({f"adaLN_modulation.0.{e}": f"adaLN_modulation.0.{e}"
                          for e in ("weight", "bias")})
        key_map.update({f"{src}.{k}": f"{dst}.{v}" for k, v in names.items()})

    for i in range(config["n_layers"]):
        block(f"layers.{i}", f"layers.{i}", True)
    for i in range(config["n_refiner_layers"]):
        block(f"context_refiner.{i}", f"context_refiner.{i}", True)
        block(f"noise_refiner.{i}", f"noise_refiner.{i}", True)
    return key_map


def base_weights(transformer) -> dict[str, torch.Tensor]:
    """The model's own weights under their names (peft's ``base_layer`` taken out)."""
    return {k.replace(".base_layer.", "."): v for k, v in transformer.state_dict().items()
            if "lora_" not in k}


def comfy_lora_key_map(transformer) -> dict[str, str]:
    """``model_lora_keys_unet``'s generic names for the native weights of the model:
    ``lora_unet_`` + the path with underscores, and the dotted ``diffusion_model.`` path."""
    native = set()
    for key in base_weights(transformer):
        mapped = comfy_native_keys(dict(transformer.config)).get(key)
        if mapped is not None:
            native.add(mapped[0] if isinstance(mapped, tuple) else mapped)
    out = {}
    for key in native:
        if key.endswith(".weight"):
            out["lora_unet_" + key[:-len(".weight")].replace(".", "_")] = key
            out["diffusion_model." + key[:-len(".weight")]] = key
    return out


COMFY_SUFFIXES = (".lora_up.weight", ".lora_down.weight", ".alpha")


@pytest.fixture(scope="module")
def trained():
    """The tiny transformer with a LoRA whose up weights are not zero (as after training)."""
    parts = build_zimage_components()
    transformer = parts["transformer"]
    transformer.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, init_lora_weights="gaussian",
                                       target_modules=target_modules(transformer)))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return parts


def outputs(transformer, model_parts):
    model = type("M", (), {**model_parts, "denoiser": transformer, "t5_max_length": 512})
    torch.manual_seed(0)
    noisy = torch.randn(2, 16, 8, 8)
    text = family("zimage").encode(model, ["a red shape", "a blue circle on green"], 1)
    with torch.no_grad():
        return family("zimage").predict(model, noisy, torch.tensor([0.3, 0.8]), text, None)


def test_the_file_is_in_comfyuis_native_names_with_nothing_left_over(trained):
    transformer = trained["transformer"]
    tensors = kohya_tensors(transformer, torch.float32)
    known = comfy_lora_key_map(transformer)
    weights = base_weights(transformer)
    names = {k.rsplit(".lora_", 1)[0].removesuffix(".alpha") for k in tensors}
    assert names and all(k.endswith(COMFY_SUFFIXES) for k in tensors)
    left = sorted(n for n in names if n not in known)
    assert not left, f"ComfyUI would log 'lora key not loaded' for {left}"
    shapes: dict[str, list[int]] = {}  # native weight -> [rows, columns]
    for key, native in comfy_native_keys(dict(transformer.config)).items():
        native = native[0] if isinstance(native, tuple) else native
        if key in weights and weights[key].dim() == 2:
            rows, cols = weights[key].shape
            shapes.setdefault(native, [0, cols])[0] += rows
    for name in names:
        up, down = tensors[name + ".lora_up.weight"], tensors[name + ".lora_down.weight"]
        assert [up.shape[0], down.shape[1]] == shapes[known[name]], name
    # what musubi-tuner's raw files name and ComfyUI refuses is not written
    assert not any("_to_q" in n or "_to_out_0" in n for n in names)
    assert any(n.endswith("layers_0_attention_qkv") for n in names)


def test_diffusers_load_lora_weights_reproduces_the_trained_output(trained, tmp_path):
    from diffusers import ZImagePipeline

    transformer = trained["transformer"]
    want = outputs(transformer, trained)
    path = tmp_path / "zimage_lora.safetensors"
    save_file(kohya_tensors(transformer, torch.float32), str(path))
    fresh = build_zimage_components()
    pipe = ZImagePipeline(**fresh)
    base = outputs(fresh["transformer"], fresh)
    pipe.load_lora_weights(load_file(str(path)))
    got = outputs(pipe.transformer, fresh)
    assert (want - base).abs().max() > 1e-3  # the LoRA changes the output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def lora_deltas(transformer) -> dict[str, torch.Tensor]:
    from peft.tuners.lora import LoraLayer

    return {p: m.get_delta_weight("default").detach() for p, m in transformer.named_modules()
            if isinstance(m, LoraLayer)}


def peer_files(transformer) -> dict[str, dict[str, torch.Tensor]]:
    """The trained LoRA as each writer writes it: ours (ComfyUI's native names), musubi-tuner's
    kohya names on diffusers' layers, ai-toolkit's peft keys under ``diffusion_model.`` (no
    alpha: the scale baked into B) and diffusers' example's under ``transformer.``."""
    from peft.tuners.lora import LoraLayer

    musubi, toolkit, example = {}, {}, {}
    for path, m in transformer.named_modules():
        if not isinstance(m, LoraLayer):
            continue
        a, b = m.lora_A["default"].weight.detach(), m.lora_B["default"].weight.detach()
        name = "lora_unet_" + path.replace(".", "_")
        musubi.update({f"{name}.lora_down.weight": a, f"{name}.lora_up.weight": b,
                       f"{name}.alpha": torch.tensor(ALPHA)})
        scaled = b * m.scaling["default"]
        toolkit.update({f"diffusion_model.{path}.lora_A.weight": a,
                        f"diffusion_model.{path}.lora_B.weight": scaled})
        example.update({f"transformer.{path}.lora_A.weight": a,
                        f"transformer.{path}.lora_B.weight": scaled})
    return {"ours": kohya_tensors(transformer, torch.float32), "musubi": musubi,
            "ai-toolkit": toolkit, "diffusers": example}


@pytest.mark.parametrize("writer", ["ours", "musubi", "ai-toolkit", "diffusers"])
def test_network_weights_continues_from_each_writers_file(trained, writer):
    """network.network_weights reads the file into a fresh network of the same rank (another
    alpha) and every layer adds what the trained one did."""
    from trainer.export.names import kohya_module_name
    from trainer.methods.lora_weights import file_kind, load_into_lora, own_forms

    transformer = trained["transformer"]
    tensors = own_forms("zimage", peer_files(transformer)[writer])
    assert file_kind(list(tensors)) == "lora"
    fresh = build_zimage_components()["transformer"]
    fresh.add_adapter(LoraConfig(r=RANK, lora_alpha=16.0, init_lora_weights="gaussian",
                                 target_modules=target_modules(fresh)))
    loaded = load_into_lora("file", tensors, fresh, lambda p: kohya_module_name("lora_unet", p))
    want, got = lora_deltas(transformer), lora_deltas(fresh)
    assert loaded == len(want) and got.keys() == want.keys()
    for path in want:
        torch.testing.assert_close(got[path], want[path], rtol=1e-5, atol=1e-6)


def test_tools_inspect_reads_our_and_musubis_files_as_zimage(trained, tmp_path):
    from trainer.tools.inspect import inspect
    from trainer.tools.options import InspectOptions

    files = peer_files(trained["transformer"])
    for writer in ("ours", "musubi"):
        path = tmp_path / f"{writer}.safetensors"
        save_file({k: v.contiguous() for k, v in files[writer].items()}, str(path))
        report = inspect(InspectOptions(path=str(path)))
        assert report.family == "zimage", (writer, report.family_reason)
        assert report.modules and report.network_type.startswith("LoRA")


def test_train_blocks_with_refiners_trains_them_and_comfyui_maps_their_names():
    """``network.train_blocks = "with_refiners"`` adds the noise and context refiners (as
    diffusers' example trains them) to the main layers (the default, musubi-tuner's); the file
    names them in ComfyUI's native form, every name mapped."""
    transformer = build_zimage_components()["transformer"]
    default = set(target_modules(transformer))
    wider = set(target_modules(transformer, "with_refiners"))
    config = dict(transformer.config)
    refiners = {f"{b}.{i}.{m}" for b in ("noise_refiner", "context_refiner")
                for i in range(config["n_refiner_layers"])
                for m in ("attention.to_q", "attention.to_k", "attention.to_v",
                          "attention.to_out.0", "feed_forward.w1", "feed_forward.w2",
                          "feed_forward.w3")}
    assert not default & refiners and wider == default | refiners
    transformer.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, init_lora_weights="gaussian",
                                       target_modules=sorted(wider)))
    names = {k.rsplit(".lora_", 1)[0].removesuffix(".alpha")
             for k in kohya_tensors(transformer, torch.float32)}
    known = comfy_lora_key_map(transformer)
    assert not sorted(n for n in names if n not in known)
    assert {"lora_unet_noise_refiner_0_attention_qkv",
            "lora_unet_context_refiner_0_feed_forward_w2"} <= names


@pytest.mark.parametrize("family,blocks,ok", [("zimage", "with_refiners", True),
                                              ("zimage", "single", False),
                                              ("flux2", "with_refiners", False),
                                              ("chroma", "double", True)])
def test_train_blocks_values_are_the_familys(family, blocks, ok, tmp_path):
    from train_helpers import one_image_dataset, small_config

    from trainer.config.files import ConfigError

    twin = {"zimage": "embedded:tiny-zimage", "flux2": "embedded:tiny-flux2",
            "chroma": "embedded:tiny-chroma"}[family]
    make = lambda: small_config(tmp_path, one_image_dataset(tmp_path / "data"),  # noqa: E731
                                model={"pretrained_model_name_or_path": twin,
                                       "model_version": family},
                                network={"train_blocks": blocks})
    if ok:
        assert make().network.train_blocks == blocks
    else:
        with pytest.raises(ConfigError, match="network.train_blocks"):
            make()
