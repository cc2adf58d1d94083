"""Qwen-Image's files where the ecosystem reads them: the LoRA file that diffusers'
``QwenImagePipeline.load_lora_weights`` loads to the trained output and whose every key ComfyUI
maps (its rules, ``comfy/lora.py`` ``model_lora_keys_unet``, applied to the original layout's
keys), the VAE in the Wan 2.1 layout that diffusers' own converter reads back, and the split
files as ComfyUI users download them (diffusion model, text encoder, VAE), which load as the
folder's model and train."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from diffusers import AutoencoderKLQwenImage, QwenImageEditPlusPipeline, QwenImagePipeline
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
    CONDITION_IMAGE_SIZE,
    calculate_dimensions,
)
from safetensors import safe_open
from safetensors.torch import save_file
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.events import ListSink
from trainer.families import detect_path, family
from trainer.families.qwen_image.checkpoint import (
    save_checkpoint,
    text_encoder_tensors,
    vae_tensors,
)
from trainer.methods.lora import LoraMethod
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.models.text_conditioning import TextConditioning
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
TWIN = "embedded:tiny-qwen-image"
LORA_SUFFIXES = (".lora_down.weight", ".lora_up.weight", ".alpha")


def predict(transformer) -> torch.Tensor:
    """The family's denoiser call on fixed inputs of the twin's shapes."""
    gen = torch.Generator().manual_seed(11)
    noisy = torch.randn(2, 16, 8, 8, generator=gen)
    hidden = torch.randn(2, 7, transformer.config.joint_attention_dim, generator=gen)
    text = TextConditioning.padded([hidden[0], hidden[1, :5]])
    model = SimpleNamespace(denoiser=transformer)
    with torch.no_grad():
        return family("qwen_image").predict(model, noisy, torch.tensor([0.4, 0.9]), text, None)


@pytest.fixture(scope="module")
def trained_lora(tmp_path_factory):
    """A LoRA run with alpha != rank: (its file, the trained transformer's output)."""
    tmp = tmp_path_factory.mktemp("qwen_lora")
    cfg = small_config(tmp, one_image_dataset(tmp / "data"),
                       model={"pretrained_model_name_or_path": TWIN},
                       network={"network_dim": 4, "network_alpha": 2.0},
                       optimizer={"learning_rate": 1e-2}, training={"max_train_steps": 2})
    seen = {}
    real_save = LoraMethod.save

    def save(self, path, model, facts, final=True):
        if final:
            seen["out"] = predict(model.denoiser)
        return real_save(self, path, model, facts, final)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LoraMethod, "save", save)
        result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    return result.output_path, seen["out"]


def test_diffusers_load_lora_weights_reproduces_the_trained_output(trained_lora):
    path, trained = trained_lora
    pipe = QwenImagePipeline.from_pretrained(resolve_model_path(TWIN), local_files_only=True)
    before = predict(pipe.transformer)
    pipe.load_lora_weights(path)
    after = predict(pipe.transformer)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, trained, atol=1e-5, rtol=1e-5)


def comfy_key_map(model_keys: list[str]) -> dict[str, str]:
    """ComfyUI's LoRA names for a Qwen-Image model (comfy/lora.py ``model_lora_keys_unet``: the
    generic ``lora_unet_`` + underscored key and dotted ``diffusion_model.`` names, then the
    QwenImage branch's bare, ``transformer.`` and ``lycoris_`` names); its model keys are
    ``diffusion_model.`` + the original layout's."""
    out = {}
    for key in model_keys:
        k = "diffusion_model." + key
        if not k.endswith(".weight"):
            continue
        bare = key[:-len(".weight")]
        out["lora_unet_" + bare.replace(".", "_")] = k
        out[k[:-len(".weight")]] = k
        out[bare] = k
        out["transformer." + bare] = k
        out["lycoris_" + bare.replace(".", "_")] = k
    return out


def test_comfyui_maps_every_key_of_the_file(trained_lora, tmp_path):
    """Each module of the file is a ComfyUI name of a Linear weight of the original layout,
    with its down, up and alpha; no key is left over ("lora key not loaded")."""
    path, _ = trained_lora
    comfy = tmp_path / "qwen_image_bf16.safetensors"
    model = load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))
    save_checkpoint(comfy, {"transformer": model.denoiser})
    with safe_open(str(comfy), "pt") as f:
        original = list(f.keys())  # the Comfy-Org layout: the transformer's bare keys
    assert "txt_norm.weight" in original and "transformer_blocks.0.img_mod.1.weight" in original
    names = comfy_key_map(original)
    with safe_open(path, "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    modules = {k[: -len(s)] for k in keys for s in LORA_SUFFIXES if k.endswith(s)}
    assert len(keys) == 3 * len(modules)  # every key is a down, up or alpha of a module
    assert all(m in names for m in modules), sorted(m for m in modules if m not in names)[:5]
    for block in range(2):  # musubi-tuner's targets, the modulations included
        for part in ("attn_to_q", "attn_to_out_0", "attn_add_k_proj", "attn_to_add_out",
                     "img_mlp_net_0_proj", "txt_mlp_net_2", "img_mod_1", "txt_mod_1"):
            assert f"lora_unet_transformer_blocks_{block}_{part}" in modules
    assert meta["ss_base_model_version"] == "qwen_image"


def test_the_vae_file_is_the_wan_layout_diffusers_reads():
    """Our Wan 2.1 names, read back by diffusers' own converter, are the VAE (real size)."""
    vae = AutoencoderKLQwenImage()
    back = convert_wan_vae_to_diffusers(vae_tensors(vae))
    state = vae.state_dict()
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert "encoder.downsamples.0.residual.0.gamma" in vae_tensors(vae)


@pytest.fixture(scope="module")
def split_files(tmp_path_factory):
    """The twin as ComfyUI users download Qwen-Image: three files."""
    root = tmp_path_factory.mktemp("qwen_split")
    model = load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))
    save_checkpoint(root / "qwen_image_bf16.safetensors", {"transformer": model.denoiser},
                    dtype=None)
    save_file(vae_tensors(model.vae), root / "qwen_image_vae.safetensors")
    save_file({k: v.contiguous() for k, v in text_encoder_tensors(model.text_encoder).items()},
              root / "qwen_2.5_vl_7b.safetensors")
    return root, model


def split_section(root, **more) -> dict:
    base = str(resolve_model_path(TWIN))
    return dict(pretrained_model_name_or_path=str(root / "qwen_image_bf16.safetensors"),
                vae=str(root / "qwen_image_vae.safetensors"),
                text_encoder=str(root / "qwen_2.5_vl_7b.safetensors"), config_dir=base,
                tokenizer=base, **more)


def test_split_files_load_as_the_folders_model(split_files):
    root, folder = split_files
    found = detect_path(root / "qwen_image_bf16.safetensors")
    assert found.family == "qwen_image" and "Qwen-Image" in found.description
    model = load_base_model(ModelSection(**split_section(root)))
    for name in ("denoiser", "vae", "text_encoder"):
        ours, theirs = getattr(model, name).state_dict(), getattr(folder, name).state_dict()
        assert ours.keys() == theirs.keys(), name
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), name
    with torch.no_grad():
        text = family("qwen_image").encode(model, ["a shape"], 0)
        again = family("qwen_image").encode(folder, ["a shape"], 0)
    assert torch.equal(text.hidden, again.hidden)


def test_a_diffusion_model_file_alone_names_the_settings(split_files):
    from trainer.families import ModelLoadError

    root, _ = split_files
    section = split_section(root)
    section.pop("vae")
    with pytest.raises(ModelLoadError, match="model.vae to qwen_image_vae.safetensors"):
        load_base_model(ModelSection(**section))


def test_split_files_train_a_lora_text_first(split_files, tmp_path):
    """The captions are encoded and Qwen2.5-VL let go before the transformer is built from
    its file (trainer/run/text_first.py: the 7B encoder and the 20B transformer never
    together)."""
    from trainer.events import Log

    root, _ = split_files
    cfg = small_config(tmp_path, one_image_dataset(tmp_path / "data"),
                       model=split_section(root), dataset={"cache_text_encoder_outputs": True},
                       training={"max_train_steps": 2, "mixed_precision": "no"})
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    lines = [e.message for e in sink.of(Log)]
    assert any(line.startswith("Text encoders released once every caption was encoded "
                               "(text_encoder") for line in lines), lines


def test_edit_2511_is_named_from_its_marker_and_loads_as_the_edit_model(split_files, tmp_path):
    """ComfyUI's ``__index_timestep_zero__`` buffer names Qwen-Image-Edit-2511: its file loads
    as the edit model (the zero-timestep reference tokens on, the marker no weight) with the
    shipped processor, and its prompt with a control is QwenImageEditPlusPipeline's."""
    from safetensors.torch import load_file

    from trainer.families.qwen_image.edit import to_pil

    root, _ = split_files
    tensors = load_file(root / "qwen_image_bf16.safetensors")
    tensors["__index_timestep_zero__"] = torch.tensor([])
    edit = tmp_path / "qwen_image_edit_2511_bf16.safetensors"
    save_file(tensors, edit)
    found = detect_path(edit)
    assert found.family == "qwen_image" and found.description.startswith("Qwen-Image-Edit-2511")
    section = split_section(root)
    section["pretrained_model_name_or_path"] = str(edit)
    model = load_base_model(ModelSection(**section))
    assert model.variant == "edit-2511" and model.denoiser.config.zero_cond_t
    assert model.processor.image_processor.size.longest_edge == 12845056  # Qwen2.5-VL, shipped
    control = torch.randint(0, 256, (1, 3, 64, 64), generator=torch.Generator().manual_seed(1))
    control = control.float() / 127.5 - 1
    with torch.no_grad():
        text = family("qwen_image").encode(model, ["a shape"], 0, controls=[control])
        plus = QwenImageEditPlusPipeline(**{k: getattr(model, k) for k in (
            "vae", "text_encoder", "tokenizer", "processor")}, transformer=model.denoiser,
            scheduler=model.noise_scheduler)
        image = to_pil(control[0])
        w, h = calculate_dimensions(CONDITION_IMAGE_SIZE, image.size[0] / image.size[1])
        embeds, _ = plus.encode_prompt(["a shape"], image=[plus.image_processor.resize(
            image, h, w)], device="cpu")
    torch.testing.assert_close(text.hidden, embeds, rtol=0, atol=0)


def scaled_fp8(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """ComfyUI's legacy scaled-fp8 form of ``tensors`` (``*_fp8_scaled.safetensors``): each 2-D
    ``.weight`` as fp8(W / s) with ``s = amax / 448`` in ``.scale_weight``, a ``scaled_fp8``
    marker; and what each weight must read back as, ``fp8 * s`` in float32."""
    fp8 = torch.float8_e4m3fn
    out, expected = {"scaled_fp8": torch.empty(0, dtype=fp8)}, {}
    for key, w in tensors.items():
        if key.endswith(".weight") and w.dim() == 2 and "embed" not in key:
            scale = (w.abs().max().float() / 448).clamp_min(1e-12)
            out[key] = (w.float() / scale).to(fp8)
            out[key[: -len("weight")] + "scale_weight"] = scale.reshape(())
            expected[key] = out[key].float() * scale
        else:
            out[key] = w.contiguous()
    return out, expected


def test_scaled_fp8_split_files_dequantize_exactly(split_files, tmp_path):
    """qwen_image_fp8 / qwen_2.5_vl_7b_fp8_scaled-style files: each weight reads as fp8 * scale
    (ComfyUI's math), the rest as stored."""
    from safetensors.torch import load_file

    root, folder = split_files
    dit, dit_expected = scaled_fp8(load_file(root / "qwen_image_bf16.safetensors"))
    te, te_expected = scaled_fp8(load_file(root / "qwen_2.5_vl_7b.safetensors"))
    save_file(dit, tmp_path / "qwen_image_fp8_scaled.safetensors")
    save_file(te, tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors")
    section = split_section(root)
    dit_file = tmp_path / "qwen_image_fp8_scaled.safetensors"
    section.update(pretrained_model_name_or_path=str(dit_file),
                   text_encoder=str(tmp_path / "qwen_2.5_vl_7b_fp8_scaled.safetensors"))
    found = detect_path(dit_file)
    assert found.family == "qwen_image" and "scaled fp8" in found.description
    model = load_base_model(ModelSection(**section))
    got = model.denoiser.state_dict()
    assert all(torch.equal(got[k], v) for k, v in dit_expected.items())
    base = folder.denoiser.state_dict()
    assert all(torch.equal(got[k], base[k]) for k in base if k not in dit_expected)
    ours = text_encoder_tensors(model.text_encoder)
    assert te_expected and all(torch.equal(ours[k], v) for k, v in te_expected.items())


def test_the_doctor_names_the_parts_a_diffusion_model_file_lacks(split_files):
    from trainer.tools.model_report import model_lines

    root, _ = split_files
    text = "\n".join(model_lines(str(root / "qwen_image_bf16.safetensors")))
    assert "Qwen-Image, 2 blocks: transformer, single file" in text
    assert "set model.vae to qwen_image_vae.safetensors" in text
    assert "set model.text_encoder to qwen_2.5_vl_7b.safetensors" in text


def test_the_text_encoder_file_loads_into_fp8_storage(split_files):
    """model.fp8_text_encoders (musubi-tuner's --fp8_vl): Qwen2.5-VL's Linear weights stored in
    fp8 as they load, the norms, embeddings and vision tower as they are; it still encodes."""
    root, folder = split_files
    model = load_base_model(ModelSection(**split_section(root, fp8_text_encoders=True)),
                            t5_frozen=True)  # the run says so: no text encoder trains
    layers = model.text_encoder.model.language_model.layers
    assert layers[0].self_attn.q_proj.weight.dtype == torch.float8_e4m3fn
    assert layers[0].input_layernorm.weight.dtype == torch.float32
    assert model.text_encoder.model.visual.blocks[0].attn.qkv.weight.dtype == torch.float32
    with torch.no_grad():
        got = family("qwen_image").encode(model, ["a shape"], 0).hidden
        full = family("qwen_image").encode(folder, ["a shape"], 0).hidden
    assert got.dtype == full.dtype and torch.allclose(got, full, atol=0.1, rtol=0.1)
