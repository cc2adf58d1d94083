"""FLUX.2 [dev] from the files ComfyUI users download (Comfy-Org/Flux-2-Dev): the diffusion model
in BFL's layout (``flux2_dev_fp8mixed.safetensors``: ComfyUI's mixed fp8; or bf16), the text
encoder ``mistral_3_small_flux2_bf16.safetensors`` (``model.text_encoder``) and the VAE
``flux2-vae.safetensors`` (``model.ae``), written from the tiny dev twin.

The text-encoder file's names are not taken from our writer: ComfyUI reads the language model
under a ``MistralForCausalLM``'s names (``model.layers.N...``, its ``comfy/text_encoders/
llama.py``), the file keeps the Pixtral vision tower and the projector beside it under their
original names (``vision_tower.*``, ``multi_modal_projector.*``) and the Tekken tokenizer as a
byte tensor; the test builds those names from transformers' ``MistralForCausalLM`` and
``PixtralVisionModel`` of the twin's configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_flux2_split_files import bf16, fp8mixed, to_bf16, train_text_first
from train_helpers import one_image_dataset, small_config

from trainer.config import ModelSection
from trainer.events import ListSink
from trainer.families import detect_path, family_of
from trainer.families.flux2.checkpoint import bfl_tensors, save_checkpoint, vae_tensors
from trainer.families.spec import ModelLoadError
from trainer.models.loader import load_base_model, resolve_model_path
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
TINY = "embedded:tiny-flux2-dev"


def comfy_text_encoder(text_encoder: torch.nn.Module, vision: bool = True
                       ) -> dict[str, torch.Tensor]:
    """The twin's Mistral3 as ComfyUI's file holds it, by name: each weight of transformers'
    ``MistralForCausalLM`` / ``PixtralVisionModel`` (built on the twin's configs) taken from the
    same weight of the twin."""
    from accelerate import init_empty_weights
    from transformers import MistralForCausalLM, PixtralVisionModel

    config = text_encoder.config
    with init_empty_weights():
        language = MistralForCausalLM(config.text_config).state_dict()
        tower = PixtralVisionModel(config.vision_config).state_dict()
    ours = text_encoder.state_dict()
    out = {k: ours[k.replace("model.", "model.language_model.", 1)] if k.startswith("model.")
           else ours[k] for k in language}
    if vision:
        out.update((f"vision_tower.{k}", ours[f"model.vision_tower.{k}"]) for k in tower)
        out.update((k[len("model."):], v) for k, v in ours.items()
                   if k.startswith("model.multi_modal_projector."))
    out = to_bf16(out)
    out["tekken_model"] = torch.tensor(list(b'{"config": {}}'), dtype=torch.uint8)
    return out


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux2_dev_split")
    model = load_base_model(ModelSection(pretrained_model_name_or_path=TINY))
    files = {"dit": root / "flux2_dev.safetensors",
             "te": root / "mistral_3_small_flux2_bf16.safetensors",
             "vae": root / "flux2-vae.safetensors",
             "mixed": root / "flux2_dev_fp8mixed.safetensors",
             "language": root / "mistral_language_only.safetensors"}
    save_checkpoint(files["dit"], {"transformer": model.denoiser}, variant="dev",
                    dtype=torch.bfloat16)
    save_file(comfy_text_encoder(model.text_encoder), str(files["te"]))
    save_file(comfy_text_encoder(model.text_encoder, vision=False), str(files["language"]))
    save_file(to_bf16(vae_tensors(model.vae)), str(files["vae"]))
    mixed, means = fp8mixed(bfl_tensors(model.denoiser))
    save_file(mixed, str(files["mixed"]))
    return model, files, means


def section(files: dict[str, Path], dit: str = "dit", te: str = "te", **more) -> ModelSection:
    folder = str(resolve_model_path(TINY))
    return ModelSection(pretrained_model_name_or_path=str(files[dit]),
                        text_encoder=str(files[te]), ae=str(files["vae"]),
                        config_dir=folder, tokenizer=folder, **more)


def test_the_split_files_load_as_the_folders_model(split):
    model, files, _ = split
    found = detect_path(files["dit"])
    assert found.family == "flux2" and found.description.startswith("FLUX.2 [dev]")
    assert any("mistral_3_small_flux2" in line for line in found.header.part_lines())
    loaded = load_base_model(section(files))
    assert loaded.variant == "dev" and loaded.description.startswith("FLUX.2 [dev]")
    for name in ("denoiser", "text_encoder", "vae"):
        want, got = bf16(getattr(model, name)), getattr(loaded, name).state_dict()
        assert got.keys() == want.keys(), name
        assert all(torch.equal(got[k].float(), want[k]) for k in want), name


def test_a_frozen_text_encoder_is_built_to_layer_30_with_the_same_features(split, tmp_path):
    """31 layers of the twin's 32 (a published file: 40); ComfyUI's pruned 30-layer file too."""
    model, files, _ = split
    whole = load_base_model(section(files))
    frozen = load_base_model(section(files, te="language"), t5_frozen=True)
    config = frozen.text_encoder.config.text_config
    assert config.num_hidden_layers == 31 < whole.text_encoder.config.text_config.num_hidden_layers
    assert frozen.text_encoder.model.vision_tower is None  # the file holds none
    pruned = tmp_path / "mistral_3_small_flux2_pruned.safetensors"
    save_file({k: v for k, v in comfy_text_encoder(model.text_encoder).items()
               if not k.startswith(("model.layers.30.", "model.layers.31."))}, str(pruned))
    short = load_base_model(section({**files, "pruned": pruned}, te="pruned"))
    assert short.text_encoder.config.text_config.num_hidden_layers == 30
    with torch.no_grad():
        a, b, c = (family_of(m).encode(m, ["a red circle", "a shape"], 1).hidden
                   for m in (whole, frozen, short))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_fp8_files_and_storage(split):
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers as convert,
    )

    _, files, means = split
    loaded = load_base_model(section(files, "mixed"), dtype=torch.bfloat16)
    want, got = convert(dict(means)), loaded.denoiser.state_dict()
    assert want and all(torch.equal(got[k], v) for k, v in want.items())
    loaded = load_base_model(section(files, "mixed", base_precision="fp8",
                                     fp8_text_encoders=True), dtype=torch.bfloat16,
                             t5_frozen=True)
    e4m3 = torch.float8_e4m3fn
    assert {p.dtype for n, p in loaded.denoiser.named_parameters() if "ff.linear_in" in n} == \
        {e4m3}
    assert e4m3 in {p.dtype for p in loaded.text_encoder.parameters()}


def test_a_wrong_or_missing_text_encoder_names_its_setting(split, tmp_path):
    _, files, _ = split
    with pytest.raises(ModelLoadError, match="model.text_encoder.*mistral_3_small_flux2"):
        load_base_model(section(files).model_copy(update={"text_encoder": None}))
    qwen = tmp_path / "qwen_3_4b.safetensors"
    save_file({"model.layers.0.post_attention_layernorm.weight": torch.ones(4),
               "model.layers.0.self_attn.q_norm.weight": torch.ones(4)}, str(qwen))
    with pytest.raises(ModelLoadError, match="no Mistral-Small-3 text encoder"):
        load_base_model(section({**files, "qwen": qwen}, te="qwen"))


def test_a_lora_trains_from_the_split_files_text_first(split, tmp_path, monkeypatch):
    """The captions are encoded and Mistral released before the 32B transformer is built."""
    _, files, _ = split
    _, logs, released = train_text_first(section(files, "mixed"), tmp_path, monkeypatch)
    assert released == [True]
    assert any("FLUX.2 [dev]" in m for m in logs if m.startswith("Base model"))
    assert any(m.startswith("Text encoders released") for m in logs)


def test_comfyuis_fp8_text_encoder_file_stays_fp8(split, tmp_path):
    """``mistral_3_small_flux2_fp8.safetensors``: the language model's Linear weights in
    ComfyUI's scaled fp8 (``comfy/quant_ops.py``: fp8(W / scale), ``weight_scale``,
    ``comfy_quant``), read as their scaled values, kept in fp8 when stored so."""
    import json as _json

    model, files, _ = split
    tensors, means = {}, {}
    e4m3 = torch.float8_e4m3fn
    for key, w in comfy_text_encoder(model.text_encoder).items():
        if not (key.startswith("model.layers.") and key.endswith("proj.weight")):
            tensors[key] = w
            continue
        layer = key[:-len(".weight")]
        scale = w.abs().amax().float() / torch.finfo(e4m3).max
        q = (w.float() / scale).to(e4m3)
        tensors.update({key: q, f"{layer}.weight_scale": scale,
                        f"{layer}.comfy_quant": torch.tensor(list(_json.dumps(
                            {"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)})
        means[key.replace("model.", "model.language_model.", 1)] = \
            (q.float() * scale).to(torch.bfloat16)
    path = tmp_path / "mistral_3_small_flux2_fp8.safetensors"
    save_file(tensors, str(path))
    read = load_base_model(section({**files, "fp8": path}, te="fp8"), dtype=torch.bfloat16)
    got = read.text_encoder.state_dict()
    assert means and all(torch.equal(got[k], v) for k, v in means.items())
    kept = load_base_model(section({**files, "fp8": path}, te="fp8", fp8_text_encoders=True),
                           dtype=torch.bfloat16, t5_frozen=True)
    q_proj = kept.text_encoder.model.language_model.layers[0].self_attn.q_proj.weight
    assert q_proj.dtype == e4m3


def test_dreambooth_from_the_split_files_writes_what_loads_back(split, tmp_path):
    """A full fine-tune of the tiny dev from its split files (one process: the twin is far
    below the published size the refusal is about): its BFL file and its diffusers folder load
    as dev, the folder's 31-layer Mistral encoding as the published one does."""
    model, files, _ = split
    data = one_image_dataset(tmp_path / "data")
    cfg = small_config(tmp_path, data, mode="dreambooth",
                       model=section(files).model_dump(exclude_none=True),
                       training={"max_train_steps": 2, "mixed_precision": "no"})
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    single, folder = Path(result.output_path), Path(result.output_path).with_suffix("")
    assert detect_path(single).header.variant == "dev"
    from_folder = load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
    from_file = load_base_model(section({**files, "dit": single}))
    assert from_folder.variant == from_file.variant == "dev"
    got, want = from_file.denoiser.state_dict(), from_folder.denoiser.state_dict()
    assert all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in want)
    assert from_folder.text_encoder.config.text_config.num_hidden_layers == 31
    with torch.no_grad():
        a = family_of(from_folder).encode(from_folder, ["a shape"], 1).hidden
        b = family_of(from_file).encode(from_file, ["a shape"], 1).hidden
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_the_refusal_reads_a_files_width_from_its_header(split):
    """The rule of tests/test_flux2_dev.py on a single file: the twin's width, not 6144."""
    from trainer.families.flux2.rules import DEV_WIDTH, transformer_width

    _, files, _ = split
    width = transformer_width(str(files["mixed"]))
    config = detect_path(files["mixed"]).header.config
    assert width == config["num_attention_heads"] * config["attention_head_dim"]
    assert width != DEV_WIDTH and transformer_width(str(files["te"])) is None
