"""Qwen-Image-Edit trained on image pairs through the normal loop, on its tiny twin: the LoRA
file loads in ``QwenImageEditPipeline`` to the trained output on a fixed control, in the
Qwen-Image LoRA form ComfyUI maps; the text cache keys each row by its controls; the loaded
variant's limit on controls is checked at the start; the validation loss reads the held-out
pairs' controls; 2509 trains on two controls a target."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from control_helpers import pairs
from diffusers import QwenImageEditPipeline
from safetensors import safe_open
from test_qwen_image_edit import TWIN, pipeline, pixels, plus_model
from test_qwen_image_files import LORA_SUFFIXES, comfy_key_map
from train_helpers import small_config

from trainer.config import ModelSection
from trainer.events import ListSink
from trainer.families import family
from trainer.families.qwen_image.checkpoint import save_checkpoint
from trainer.methods.lora import LoraMethod
from trainer.models.loader import load_base_model
from trainer.models.text_conditioning import TextConditioning
from trainer.run.loop import run

pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def model():
    return load_base_model(ModelSection(pretrained_model_name_or_path=TWIN))


FIXED_CONTROL = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(12))


def predict(transformer) -> torch.Tensor:
    """The family's edit denoiser call on fixed inputs and a fixed control."""
    gen = torch.Generator().manual_seed(11)
    noisy = torch.randn(1, 16, 8, 8, generator=gen)
    text = TextConditioning(torch.randn(1, 7, transformer.config.joint_attention_dim,
                                        generator=gen))
    twin = SimpleNamespace(denoiser=transformer)
    with torch.no_grad():
        return family("qwen_image").predict(twin, noisy, torch.tensor([0.6]), text, None,
                                            controls=[FIXED_CONTROL])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA trained on two image pairs (a target, its inverted control) through the loop,
    alpha != rank: (its file, the trained output, the run's batches' control counts)."""
    tmp = tmp_path_factory.mktemp("qwen_edit_lora")
    train = pairs(tmp / "data", names=("a", "b"), sizes=((64, 64), (64, 64)))
    cfg = small_config(tmp, train, model={"pretrained_model_name_or_path": TWIN},
                       dataset={"control_dir": "control", "cache_latents": True},
                       network={"network_dim": 4, "network_alpha": 2.0},
                       optimizer={"learning_rate": 1e-2}, training={"max_train_steps": 2})
    seen, texts, preds = {}, [], []
    kind = type(family("qwen_image"))
    real_save, real_encode, real_predict = LoraMethod.save, kind.encode, kind.predict

    def save(self, path, model, facts, final=True):
        if final:
            seen["out"] = predict(model.denoiser)
        return real_save(self, path, model, facts, final)

    def encode(self, model, captions, clip_skip, controls=None):
        texts.append(len(controls or ()))
        return real_encode(self, model, captions, clip_skip, controls)

    def predict_(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        preds.append([(tuple(noisy.shape), tuple(c.shape)) for c in controls or ()])
        return real_predict(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LoraMethod, "save", save)
        patch.setattr(kind, "encode", encode)
        patch.setattr(kind, "predict", predict_)
        result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    return result.output_path, seen["out"], (texts, preds)


def test_the_loop_feeds_each_step_its_control(trained):
    """Each target's text encoded once (the cache keyed by its control), with its control's
    pixels, and the control's cached latents beside the target's in the denoiser call."""
    _, _, (texts, preds) = trained
    assert texts == [1, 1]
    step = [((1, 16, 8, 8), (1, 16, 8, 8))]  # 64 px target and control: 8 x 8 latents
    assert preds[:2] == [step, step]


def test_edit_pipeline_load_lora_weights_reproduces_the_trained_output(trained, model):
    path, out, _ = trained
    pipe = pipeline(QwenImageEditPipeline, model)
    before = predict(pipe.transformer)
    pipe.load_lora_weights(path)
    after = predict(pipe.transformer)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, out, atol=1e-5, rtol=1e-5)


def test_the_file_is_the_qwen_image_comfyui_form_with_nothing_left_over(trained, model,
                                                                        tmp_path):
    path, _, _ = trained
    comfy = tmp_path / "qwen_image_edit_bf16.safetensors"
    save_checkpoint(comfy, {"transformer": model.denoiser})
    with safe_open(str(comfy), "pt") as f:
        names = comfy_key_map(list(f.keys()))
    with safe_open(path, "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    modules = {k[: -len(s)] for k in keys for s in LORA_SUFFIXES if k.endswith(s)}
    assert len(keys) == 3 * len(modules)
    assert all(m in names for m in modules), sorted(m for m in modules if m not in names)[:5]
    assert meta["ss_base_model_version"] == "qwen_image"
    # musubi-tuner's ARCH_QWEN_IMAGE_EDIT, in the case of the base model's "qwen-image/lora"
    assert meta["modelspec.architecture"] == "qwen-image-edit/lora"


def pair_data(root, model_path: str = TWIN, **dataset):
    """Two targets with the same caption and different controls, prepared for the twin."""
    from trainer.config import TrainConfig
    from trainer.data import prepare_dataset

    train = pairs(root / "data", names=("a", "b"), sizes=((64, 64), (64, 64)))
    (train / "3_edit" / "b.txt").write_text("make a inverted")  # a's caption
    cfg = TrainConfig(model={"pretrained_model_name_or_path": model_path},
                      dataset={"train_data_dir": str(train), "resolution": 64,
                               "min_bucket_reso": 64, "control_dir": "control", **dataset})
    return prepare_dataset(cfg, lambda _: None, data_home=root)


def test_the_text_cache_keys_each_row_by_its_controls(model, tmp_path):
    """The text conditioning of a pair depends on its control: the cache keys a row by its
    caption and its control as rendered (flip included), each encoded with its control, so
    two targets with one caption get their own outputs, each the encode with its control."""
    data = pair_data(tmp_path, flip_aug=True)
    assert data.text_cache_blocker is None
    calls = []

    def encode(captions, controls=None):
        calls.append(len(controls or ()))
        return family("qwen_image").encode(model, captions, 0, controls=controls)

    with torch.no_grad():
        assert data.cache_text(encode) == 4  # two targets, each unflipped and flipped
    assert calls == [1, 1, 1, 1]
    seen = []
    for epoch in range(3):
        for batch in data.epoch(epoch, 1, seed=0):
            with torch.no_grad():
                direct = family("qwen_image").encode(model, batch.captions, 0,
                                                     controls=batch.control_pixels)
            torch.testing.assert_close(batch.text.hidden, direct.hidden, rtol=0, atol=0)
            seen.append(batch.text.hidden)
    assert batch.captions == ["make a inverted"]
    assert any((x - seen[0]).abs().max() > 1e-4 for x in seen[1:])


def test_controls_that_change_each_step_keep_the_text_out_of_the_cache(tmp_path):
    """A colour draw changes the control's pixels each step: its text outputs are not
    cached, and the dataset says why (each step then encodes with its controls)."""
    data = pair_data(tmp_path, color_aug=True, cache_latents=False)
    assert "dataset.color_aug is on, and Qwen-Image's text encoder reads the control" in \
        data.text_cache_blocker
    with pytest.raises(ValueError, match="cannot be cached: .*color_aug"):
        data.cache_text(lambda captions, controls=None: None)
    assert pair_data(tmp_path / "plain").text_cache_blocker is None


def test_without_the_cache_each_step_encodes_with_its_controls(tmp_path):
    """dataset.cache_text_encoder_outputs = false, latents cached: the batches still carry
    the control pixels the text encoder reads."""
    train = pairs(tmp_path / "data", names=("a",), sizes=((64, 64),))
    cfg = small_config(tmp_path, train, model={"pretrained_model_name_or_path": TWIN},
                       dataset={"control_dir": "control", "cache_latents": True,
                                "cache_text_encoder_outputs": False},
                       training={"max_train_steps": 2})
    kind, texts = type(family("qwen_image")), []
    real = kind.encode

    def encode(self, model, captions, clip_skip, controls=None):
        texts.append(len(controls or ()))
        return real(self, model, captions, clip_skip, controls)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kind, "encode", encode)
        result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    assert texts == [1, 1]  # one target, two steps: encoded each step


def test_plus_trains_on_two_controls_through_the_loop(tmp_path, tmp_path_factory):
    """2509 with two references a target (``a_0.png``, ``a_1.png``): each step's text and
    denoiser call read both."""
    from control_helpers import inverted, noise

    plus = plus_model(tmp_path_factory)
    train = tmp_path / "data" / "train"
    noise(train / "1_edit" / "a.png", (64, 64), 0)
    (train / "1_edit" / "a.txt").write_text("swap them")
    for i in range(2):
        inverted(train / "1_edit" / "a.png", train / "control" / f"a_{i}.png")
    cfg = small_config(tmp_path, train, model={"pretrained_model_name_or_path": plus.source},
                       dataset={"control_dir": "control"}, training={"max_train_steps": 1})
    kind, seen = type(family("qwen_image")), []
    real = kind.predict

    def predict_(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        seen.append((model.variant, len(controls or ()), text.hidden.shape[1]))
        return real(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kind, "predict", predict_)
        result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    with torch.no_grad():
        one = family("qwen_image").encode(plus, ["swap them"], 0, controls=[pixels(0, 1, 64, 64)])
    assert seen[0][:2] == ("edit-2509", 2)
    assert seen[0][2] > one.hidden.shape[1]  # the second picture's tokens in the prompt


@pytest.mark.parametrize("model_path, controls, refusal", [
    (TWIN, 2, "Qwen-Image-Edit takes at most 1 control image(s) per training image, one has 2"),
    ("embedded:tiny-qwen-image", 1, "Qwen-Image is not an edit model"),
])
def test_the_loaded_variant_refuses_controls_it_cannot_take(tmp_path, model_path, controls,
                                                            refusal):
    """The family (Qwen-Image) takes up to three controls; the loaded variant's own limit is
    checked when the run starts, before any step."""
    from control_helpers import inverted, noise

    train = tmp_path / "data" / "train"
    noise(train / "1_edit" / "a.png", (64, 64), 0)
    for i in range(controls):
        inverted(train / "1_edit" / "a.png", train / "control" / f"a_{i}.png")
    cfg = small_config(tmp_path, train, model={"pretrained_model_name_or_path": model_path},
                       dataset={"control_dir": "control"})
    kind, encoded = type(family("qwen_image")), []
    real = kind.encode

    def encode(self, *args, **kw):
        encoded.append(1)
        return real(self, *args, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kind, "encode", encode)
        result = run(cfg, ListSink())
    assert result.status == "failed" and refusal in result.error, result.error
    assert encoded == []  # refused before the first caption is encoded


def test_the_validation_loss_reads_the_held_out_images_controls(tmp_path):
    """dataset.validation_split: the held-out pair is scored with its control, in the text
    encoder and beside the target's tokens, as the training steps are."""
    from trainer.events import Validation

    train = pairs(tmp_path / "data", names=("a", "b", "c"), sizes=((64, 64),) * 3)
    cfg = small_config(tmp_path, train, model={"pretrained_model_name_or_path": TWIN},
                       dataset={"control_dir": "control", "validation_split": 0.34},
                       training={"max_train_steps": 1})
    kind, calls = type(family("qwen_image")), []
    real = kind.predict

    def predict_(self, model, noisy, t, text, size_ids, cfg=None, denoiser=None, controls=None):
        calls.append(len(controls or ()))
        return real(self, model, noisy, t, text, size_ids, cfg, denoiser, controls)

    sink = ListSink()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kind, "predict", predict_)
        result = run(cfg, sink)
    assert result.status == "finished", result.error
    [scored] = sink.of(Validation)
    assert scored.images == 1 and scored.loss > 0
    assert calls and set(calls) == {1}  # every call, the training's and the validation's


def test_a_dreambooth_folder_of_an_edit_model_loads_as_that_edit_model(tmp_path):
    """DreamBooth writes an edit variant's diffusers folder as its own pipeline, with its image
    processor (``QwenImageEditPipeline``), not as the text-to-image QwenImagePipeline: the
    folder loads again as Qwen-Image-Edit, in diffusers and here."""
    import json

    train = pairs(tmp_path / "data", names=("a", "b"), sizes=((64, 64), (64, 64)))
    cfg = small_config(tmp_path, train, mode="dreambooth",
                       model={"pretrained_model_name_or_path": TWIN},
                       dataset={"control_dir": "control"}, training={"max_train_steps": 1})
    result = run(cfg, ListSink())
    assert result.status == "finished", result.error
    folder = next(p.parent for p in (tmp_path / "out").rglob("model_index.json"))
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == \
        "QwenImageEditPipeline"
    assert (folder / "processor" / "tokenizer_config.json").is_file()
    loaded = load_base_model(ModelSection(pretrained_model_name_or_path=str(folder)))
    assert loaded.variant == "edit" and loaded.processor is not None
    # diffusers reads it too (the processor passed in: without torchvision, transformers
    # cannot build Qwen2VLProcessor's video part, which the pipeline does not use)
    pipe = QwenImageEditPipeline.from_pretrained(folder, processor=loaded.processor,
                                                 local_files_only=True)
    assert type(pipe).__name__ == "QwenImageEditPipeline"
