"""Every family trains from a folder and from a single file, and the ecosystem loads the result.

Tiny SD 1.x, SD 2.x (v-prediction) and SDXL models are written as diffusers folders and as
single files in the original layout; LoRA, DreamBooth and textual inversion train 2 steps on
them with the network closed, and diffusers' own loaders read what was saved back onto a fresh
pipeline, which must reproduce the trained model.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.events import ListSink
from trainer.families.sd.checkpoint import save_checkpoint
from trainer.families.sd.tiny import save_tiny_model
from trainer.models.loader import load_base_model
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")
PIPELINES = {"sd1": "StableDiffusionPipeline", "sd2": "StableDiffusionPipeline",
             "sdxl": "StableDiffusionXLPipeline"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (diffusers folder, single file of the same weights)."""
    from trainer.config import ModelSection

    root = tmp_path_factory.mktemp("families")
    out = {}
    for family in PIPELINES:
        folder = save_tiny_model(root / family, family=family)
        m = load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
        single = save_checkpoint(root / f"{family}.safetensors", m.unet, m.vae, m.text_encoder,
                                 text_encoder_2=m.text_encoder_2, family=family,
                                 dtype=torch.float32)
        out[family] = (folder, single)
    return out


def pipeline(family, folder):
    import diffusers

    return getattr(diffusers, PIPELINES[family]).from_pretrained(folder, local_files_only=True)


def model_settings(family, models, single):
    folder, file = models[family]
    if not single:
        return {"pretrained_model_name_or_path": str(folder)}
    return {"pretrained_model_name_or_path": str(file), "config_dir": str(folder),
            "tokenizer": str(folder)}


def probe(unet, family):
    """The UNet's output on fixed inputs (with SDXL's added conditioning)."""
    gen = torch.Generator().manual_seed(0)
    width = unet.config.cross_attention_dim
    x, hidden = torch.randn(1, 4, 8, 8, generator=gen), torch.randn(1, 77, width, generator=gen)
    added = None
    if family == "sdxl":
        pooled = unet.config.projection_class_embeddings_input_dim - 6 * unet.config \
            .addition_time_embed_dim
        added = {"text_embeds": torch.randn(1, pooled, generator=gen),
                 "time_ids": torch.tensor([[64.0, 64, 0, 0, 64, 64]])}
    with torch.no_grad():
        return unet(x, torch.tensor([500]), hidden, added_cond_kwargs=added).sample


@pytest.fixture
def at_save(monkeypatch):
    """The trained modules' probe output and state at the (final) save of each method."""
    from trainer.methods.dreambooth import DreamBoothMethod
    from trainer.methods.lora import LoraMethod

    seen = {}
    for cls in (LoraMethod, DreamBoothMethod):
        real = cls.save

        def save(self, path, model, facts, final=True, _real=real):
            seen["unet"] = probe(model.unet, model.version)
            seen["state"] = {n: {k: v.detach().clone() for k, v in
                                 getattr(model, n).state_dict().items()}
                             for n in ("unet", "text_encoder", "text_encoder_2")
                             if getattr(model, n, None) is not None}
            return _real(self, path, model, facts, final)

        monkeypatch.setattr(cls, "save", save)
    return seen


def train(tmp_path, models, family, single, mode="lora", **sections):
    data = tmp_path / "data"
    if not data.exists():
        one_image_dataset(data)
    sections.setdefault("training", {}).update(max_train_steps=2)
    cfg = small_config(tmp_path, data, mode=mode,
                       model=model_settings(family, models, single), **sections)
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    return result.output_path, sink


@pytest.mark.parametrize("single", [False, True], ids=["folder", "single_file"])
@pytest.mark.parametrize("family", ["sd1", "sd2", "sdxl"])
def test_lora_on_every_family_loads_in_diffusers(tmp_path, models, family, single, at_save):
    path, sink = train(tmp_path, models, family, single,
                       network={"train_text_encoder": True},
                       optimizer={"learning_rate": 1e-2})
    pipe = pipeline(family, models[family][0])
    before = probe(pipe.unet, family)
    pipe.load_lora_weights(path)
    loaded = probe(pipe.unet, family)
    assert torch.allclose(loaded, at_save["unet"], atol=1e-4)
    assert not torch.allclose(loaded, before, atol=1e-4)
    file_pairs = sum(1 for k in load_file(path) if k.endswith("lora_down.weight"))
    encoders = [pipe.unet, pipe.text_encoder] + (
        [pipe.text_encoder_2] if family == "sdxl" else [])
    loaded_pairs = sum(1 for m in encoders for n, _ in m.named_modules()
                       if n.endswith("lora_A.default_0"))
    assert loaded_pairs == file_pairs  # every module of the file found its layer
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    expected = {"sd1": ("sd_v1", "stable-diffusion-v1/lora", "False"),
                "sd2": ("sd_v2_v", "stable-diffusion-v2-768-v/lora", "True"),
                "sdxl": ("sdxl_base_v1-0", "stable-diffusion-xl-v1-base/lora", "False")}[family]
    assert (meta["ss_base_model_version"], meta["modelspec.architecture"],
            meta["ss_v2"]) == expected
    assert any("Base model:" in getattr(e, "message", "") and
               ("SDXL" if family == "sdxl" else "SD") in e.message for e in sink.events)


@pytest.mark.parametrize("family", ["sd2", "sdxl"])
def test_dreambooth_single_file_round_trips_through_diffusers(tmp_path, models, family,
                                                              at_save):
    import diffusers

    path, _ = train(tmp_path, models, family, True, mode="dreambooth",
                    network={"train_text_encoder": True},
                    saving={"save_precision": "fp32", "output_name": "db"})
    cls = getattr(diffusers, PIPELINES[family])
    folder = tmp_path / "out" / "db"
    pipe = cls.from_single_file(path, config=str(folder), local_files_only=True)
    for name, state in at_save["state"].items():
        got = getattr(pipe, name).state_dict()
        for key, tensor in state.items():
            assert torch.equal(got[key], tensor), f"{name}: {key}"
    assert torch.allclose(probe(cls.from_pretrained(folder).unet, family), at_save["unet"],
                          atol=1e-5)


def test_textual_inversion_on_sdxl_writes_clip_l_and_clip_g(tmp_path, models, monkeypatch):
    from trainer.methods.textual_inversion import TextualInversionMethod

    rows = {}
    real = TextualInversionMethod.save

    def save(self, path, model, facts, final=True):
        rows["l"], rows["g"] = (v.detach().clone() for v in self.embeddings(model))
        return real(self, path, model, facts, final)

    monkeypatch.setattr(TextualInversionMethod, "save", save)
    path, _ = train(tmp_path, models, "sdxl", True, mode="textual_inversion",
                    network={"token_string": "<xl>", "num_vectors_per_token": 2,
                             "init_word": "shape", "caption_templates": "object"},
                    optimizer={"learning_rate": 5e-2}, saving={"save_precision": "fp32"})
    tensors = load_file(path)
    assert set(tensors) == {"clip_l", "clip_g"}
    assert tensors["clip_l"].shape == (2, 32) and tensors["clip_g"].shape == (2, 48)
    pipe = pipeline("sdxl", models["sdxl"][0])
    pipe.load_textual_inversion(tensors["clip_l"], token="<xl>", text_encoder=pipe.text_encoder,
                                tokenizer=pipe.tokenizer)
    pipe.load_textual_inversion(tensors["clip_g"], token="<xl>",
                                text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2)
    for encoder, tokenizer, key in ((pipe.text_encoder, pipe.tokenizer, "l"),
                                    (pipe.text_encoder_2, pipe.tokenizer_2, "g")):
        ids = tokenizer.convert_tokens_to_ids(["<xl>", "<xl>_1"])
        assert torch.equal(encoder.get_input_embeddings().weight[ids], rows[key])


def test_sdxl_text_cache_gives_the_same_losses_as_encoding_each_step(tmp_path, models):
    losses = []
    for cache in (False, True):
        _, sink = train(tmp_path / str(cache), models, "sdxl", False,
                        dataset={"cache_text_encoder_outputs": cache})
        losses.append([e.loss for e in sink.events if type(e).__name__ == "Step"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_the_tiny_sdxl_preset_trains_and_samples(tmp_path):
    from trainer.config.files import load
    from trainer.config.paths import PROJECT_ROOT
    from trainer.events import Sample

    cfg = load(PROJECT_ROOT / "presets" / "lora" / "tiny-sdxl.toml",
               [f"saving.output_dir={tmp_path}", "training.log_with=none",
                "training.max_train_steps=4", "sampling.sample_every_n_steps=4",
                "sampling.sample_steps=2"])
    sink = ListSink()
    result = run(cfg, sink)
    assert result.status == "finished", result.error
    assert [s.step for s in sink.of(Sample)] == [4] and all(
        p.endswith(".png") for s in sink.of(Sample) for p in s.paths)
    with safe_open(result.output_path, "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("lora_te2_") for k in keys)
    assert any(k.startswith("lora_unet_input_blocks_") for k in keys)
