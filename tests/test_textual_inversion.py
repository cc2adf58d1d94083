"""Textual inversion end to end on the tiny model: only the token's rows learn, the file is the
``emb_params`` embedding diffusers loads, and unusable tokens, words and captions are refused."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from train_helpers import one_image_dataset, small_config

from trainer.config.files import ConfigError, from_dict, load
from trainer.config.paths import PROJECT_ROOT
from trainer.data import prepare_dataset
from trainer.data.errors import DatasetError
from trainer.events import ListSink, Sample, Started
from trainer.export.embedding import save_embedding
from trainer.methods.textual_inversion import (
    TextualInversionMethod,
    TokenError,
    init_rows,
    token_names,
)
from trainer.run.loop import run
from trainer.run.step import expand_multi_vector_tokens

TOKEN = "<tok>"
INIT_WORD = "circle"  # one token of the tiny tokenizer
TEXT_WIDTH = 32  # the tiny text encoder's hidden size
LR, WEIGHT_DECAY, STEPS = 5e-3, 0.1, 4
TI_PRESET = PROJECT_ROOT / "presets" / "textual_inversion" / "default.toml"


def ti_config(tmp_path: Path, data_dir: Path, network=None, **sections):
    """A few-step textual-inversion run on ``data_dir`` at 64 px, saved in fp32."""
    data = small_config(tmp_path, data_dir).model_dump(mode="json", exclude_none=True)
    data["mode"] = "textual_inversion"
    data["network"] = {"token_string": TOKEN, "init_word": INIT_WORD, **(network or {})}
    # weight decay touches every row of the matrix, so the restore after each step must work
    data["optimizer"].update(learning_rate=LR, weight_decay=WEIGHT_DECAY)
    data["training"]["max_train_steps"] = STEPS
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return from_dict(data)


def fresh_pipeline(model_dir):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def cloned(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def embedding_key(text_encoder_state: dict) -> str:
    """The input-embedding matrix's key (transformers 5 drops the ``text_model.`` prefix)."""
    (key,) = [k for k in text_encoder_state if k.endswith("token_embedding.weight")]
    return key


@dataclass
class TrainedRun:
    vectors: int
    captions: str  # "dataset": captions hold the token; "object": built-in templates
    cfg: object
    result: object
    at_save: dict  # the model as it was saved: token ids, state dicts


def _train(tmp_path: Path, vectors: int, captions: str) -> TrainedRun:
    with_token = captions == "dataset"
    data = one_image_dataset(tmp_path / "data",
                             caption=f"a photo of {TOKEN}" if with_token else "a red circle")
    network = {"num_vectors_per_token": vectors}
    if not with_token:
        network["caption_templates"] = captions
    cfg = ti_config(tmp_path, data, network)
    at_save: dict = {}
    real_save = TextualInversionMethod.save

    def save_and_capture(self, path, model, facts, final=True):
        at_save.update(ids=list(self.token_ids), text_encoder=cloned(model.text_encoder),
                       unet=cloned(model.unet), vae=cloned(model.vae))
        return real_save(self, path, model, facts, final)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TextualInversionMethod, "save", save_and_capture)
        result = run(cfg, ListSink())
    return TrainedRun(vectors, captions, cfg, result, at_save)


@pytest.fixture(scope="module", params=[(1, "dataset"), (3, "dataset"), (1, "object"),
                                        (3, "object")], ids=lambda p: f"{p[0]}vec-{p[1]}")
def trained(request, tmp_path_factory) -> TrainedRun:
    vectors, captions = request.param
    return _train(tmp_path_factory.mktemp(f"ti{vectors}{captions}"), vectors, captions)


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    """The tiny model's components as they are on disk, and its tokenizer."""
    pipe = fresh_pipeline(tiny_model_dir)
    text_encoder = cloned(pipe.text_encoder)
    key = embedding_key(text_encoder)
    return {"text_encoder": text_encoder, "unet": cloned(pipe.unet), "vae": cloned(pipe.vae),
            "tokenizer": pipe.tokenizer, "key": key, "table": text_encoder[key]}


# -- 1. the run and its file ---------------------------------------------------------------------
def test_the_run_writes_emb_params_with_metadata(trained):
    assert trained.result.status == "finished", trained.result.error
    out = Path(trained.cfg.saving.output_dir) / f"{trained.cfg.saving.output_name}.safetensors"
    assert trained.result.output_path == str(out) and out.is_file()
    tensors = load_file(str(out))
    assert list(tensors) == ["emb_params"]
    assert tuple(tensors["emb_params"].shape) == (trained.vectors, TEXT_WIDTH)
    assert tensors["emb_params"].dtype == torch.float32  # save_precision = fp32
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["modelspec.architecture"].endswith("/textual-inversion")
    assert meta["modelspec.trigger_phrase"] == TOKEN
    assert meta["ti_token_string"] == TOKEN
    assert meta["ti_num_vectors"] == str(trained.vectors)
    assert meta["ss_steps"] == str(STEPS)
    assert re.fullmatch(r"[0-9a-f]{8}", meta["ti_base_model_hash"].lower())


# -- 2. only the token's rows learn ----------------------------------------------------------------
def test_only_the_token_rows_learn_bit_for_bit(trained, base):
    assert trained.result.status == "finished", trained.result.error
    saved, before = trained.at_save, base
    key = before["key"]
    vocab = before["table"].shape[0]
    assert saved["ids"] == list(range(vocab, vocab + trained.vectors))  # new rows at the end
    table = saved["text_encoder"][key]
    assert table.shape == (vocab + trained.vectors, TEXT_WIDTH)
    assert torch.equal(table[:vocab], before["table"])
    for name, tensor in before["text_encoder"].items():
        if name != key:
            assert torch.equal(saved["text_encoder"][name], tensor), name
    released = {k for k in before["vae"] if k.startswith(("decoder.", "post_quant_conv."))}
    assert released and saved["vae"].keys() == before["vae"].keys() - released  # unused.py
    for part in ("unet", "vae"):
        assert saved[part].keys() <= before[part].keys()
        for name, tensor in ((n, t) for n, t in before[part].items() if n in saved[part]):
            assert torch.equal(saved[part][name], tensor), f"{part}.{name}"
    # every vector moved by more than weight decay alone would move it: its gradient arrived
    start = init_rows(before["tokenizer"], before["table"], INIT_WORD, trained.vectors)
    decayed = start * (1 - LR * WEIGHT_DECAY) ** STEPS
    for row, (got, was) in enumerate(zip(table[saved["ids"]], decayed)):
        assert (got - was).abs().max() > 1e-3, f"vector {row} did not learn"


# -- 3. diffusers loads it -------------------------------------------------------------------------
def _encode(pipe, prompt: str) -> torch.Tensor:
    prompt = pipe.maybe_convert_prompt(prompt, pipe.tokenizer)
    ids = pipe.tokenizer([prompt], padding="max_length", max_length=77,
                         return_tensors="pt").input_ids
    with torch.no_grad():
        return pipe.text_encoder(ids)[0]


def test_diffusers_loads_the_trained_embedding(trained, tiny_model_dir, base, tmp_path):
    assert trained.result.status == "finished", trained.result.error
    pipe = fresh_pipeline(tiny_model_dir)
    pipe.load_textual_inversion(trained.result.output_path, token=TOKEN)
    names = token_names(TOKEN, trained.vectors)
    assert names == [TOKEN] + [f"{TOKEN}_{i}" for i in range(1, trained.vectors)]
    assert all(n in pipe.tokenizer.get_added_vocab() for n in names)
    ids = pipe.tokenizer.convert_tokens_to_ids(names)
    loaded = pipe.text_encoder.get_input_embeddings().weight[ids]
    saved = trained.at_save["text_encoder"]
    trained_rows = saved[embedding_key(saved)][trained.at_save["ids"]]
    assert torch.equal(loaded, trained_rows)  # fp32 save: exact
    # the untrained vectors (under another token) encode like the init word repeated n times;
    # the trained ones do not
    start = init_rows(base["tokenizer"], base["table"], INIT_WORD, trained.vectors)
    pipe.load_textual_inversion(str(save_embedding(tmp_path / "start.safetensors", start)),
                                token="<start>")
    prompt = f"a photo of {TOKEN}"
    as_init = _encode(pipe, prompt.replace(TOKEN, " ".join([INIT_WORD] * trained.vectors)))
    assert torch.allclose(_encode(pipe, prompt.replace(TOKEN, "<start>")), as_init, atol=1e-6)
    assert not torch.allclose(_encode(pipe, prompt), as_init, atol=1e-4)
    image = pipe(prompt, num_inference_steps=2, height=64, width=64, guidance_scale=2.0,
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (64, 64)


# -- 4. initialization -----------------------------------------------------------------------------
def test_init_rows_copy_and_cycle_the_init_words_tokens(base):
    tok, weight = base["tokenizer"], base["table"]
    circle = tok.encode("circle", add_special_tokens=False)
    red_circle = tok.encode("red circle", add_special_tokens=False)
    assert len(circle) == 1 and len(red_circle) == 2
    single = init_rows(tok, weight, "circle", 3)
    assert single.shape == (3, TEXT_WIDTH)
    assert all(torch.equal(row, weight[circle[0]]) for row in single)
    cycled = init_rows(tok, weight, "red circle", 3)  # vector i = token i mod 2
    assert [torch.equal(cycled[i], weight[red_circle[i % 2]]) for i in range(3)] == [True] * 3
    assert torch.equal(init_rows(tok, weight, "red circle", 1)[0], weight[red_circle[0]])
    assert torch.allclose(init_rows(tok, weight, None, 2), weight.mean(0).expand(2, -1))
    with pytest.raises(TokenError, match="network.init_word"):
        init_rows(tok, weight, "   ", 2)


def prepared(tmp_path: Path, **network):
    """The tiny model after the method's ``prepare``, and the method."""
    from trainer.models.loader import load_base_model

    cfg = ti_config(tmp_path, tmp_path, network)
    model = load_base_model(cfg.model)
    method = TextualInversionMethod(cfg)
    return model, method, method.prepare(model)


def test_prepare_adds_the_tokens_and_trains_only_the_embedding_matrix(tmp_path, base):
    model, method, groups = prepared(tmp_path, num_vectors_per_token=2, init_word="red circle")
    weight = model.text_encoder.get_input_embeddings().weight
    assert [p for g in groups for p in g["params"]] == [weight]
    trainable = [n for n, p in model.text_encoder.named_parameters() if p.requires_grad]
    assert trainable == [base["key"]]
    assert not any(p.requires_grad for p in model.unet.parameters())
    assert not any(p.requires_grad for p in model.vae.parameters())
    ids = model.tokenizer.convert_tokens_to_ids([TOKEN, f"{TOKEN}_1"])
    assert method.token_ids == ids
    red, circle = base["tokenizer"].encode("red circle", add_special_tokens=False)
    table = base["table"]
    assert torch.equal(weight[ids[0]], table[red]) and torch.equal(weight[ids[1]], table[circle])


def test_without_init_word_the_vectors_start_at_the_mean_of_the_old_rows(tmp_path, base):
    model, method, _ = prepared(tmp_path, num_vectors_per_token=2, init_word=None)
    rows = model.text_encoder.get_input_embeddings().weight[method.token_ids]
    mean = base["table"].float().mean(0)  # of the vocabulary before the new rows were added
    assert torch.equal(rows[0], mean) and torch.equal(rows[1], mean)


def test_an_init_word_naming_the_token_reads_the_old_vocabulary(tmp_path, base):
    model, method, _ = prepared(tmp_path, init_word=TOKEN)  # "<tok>" was 4 BPE pieces
    row = model.text_encoder.get_input_embeddings().weight[method.token_ids[0]]
    first = base["tokenizer"].encode(TOKEN, add_special_tokens=False)[0]
    assert torch.equal(row, base["table"][first])


# -- 5. refusals -----------------------------------------------------------------------------------
def test_captions_without_the_token_are_refused_naming_the_file(tmp_path):
    data = one_image_dataset(tmp_path / "data", caption="a red circle")
    result = run(ti_config(tmp_path, data))
    assert result.status == "failed"
    for words in ("circle.png", "network.token_string", "dataset.caption_prefix",
                  "network.caption_templates"):
        assert words in result.error, words
    # the suggested fix works: the prefix puts the token in every caption
    fixed = ti_config(tmp_path, data, dataset={"caption_prefix": TOKEN})
    assert prepare_dataset(fixed, warn=print).num_images == 1
    with pytest.raises(DatasetError, match="circle.png"):
        prepare_dataset(ti_config(tmp_path, data), warn=print)


@pytest.mark.parametrize("token", ["shape", "Circle", "photo"])
def test_a_token_the_tokenizer_knows_is_refused(tmp_path, token):
    data = one_image_dataset(tmp_path / "data", caption=f"a {token}")
    result = run(ti_config(tmp_path, data, {"token_string": token}))
    assert result.status == "failed"
    assert "network.token_string" in result.error and repr(token) in result.error
    assert "already knows" in result.error


def test_a_multi_vector_token_the_tokenizer_lowercases_is_refused(tmp_path):
    # diffusers' pipelines would read '<mytok>' and not find '<MyTok>_1': one vector of two
    with pytest.raises(TokenError, match=r"network.token_string = '<MyTok>'.*'<mytok>'"):
        prepared(tmp_path, token_string="<MyTok>", num_vectors_per_token=2)
    model, method, _ = prepared(tmp_path, token_string="<MyTok>")  # one vector: no expansion
    assert model.tokenizer("a <MyTok>").input_ids[2] == method.token_ids[0]


@pytest.mark.parametrize("changes, field", [
    ({"network": {"token_string": "<my cat>"}}, "network.token_string"),
    ({"network": {"token_string": " <tok>"}}, "network.token_string"),
    ({"network": {"token_string": None}}, "network.token_string"),
    ({"dataset": {"reg_data_dir": "reg"}}, "dataset.reg_data_dir"),
])
def test_config_refusals(tmp_path, changes, field):
    data = ti_config(tmp_path, tmp_path).model_dump(mode="json", exclude_none=True)
    for section, values in changes.items():
        data[section].update(values)
    with pytest.raises(ConfigError, match=field):
        from_dict(data)


# -- 6. several vectors in a prompt ----------------------------------------------------------------
def test_multi_vector_tokens_expand_as_diffusers_expands_them(tmp_path, tiny_model_dir):
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(tiny_model_dir, subfolder="tokenizer")
    tok.add_tokens(token_names(TOKEN, 3) + ["<one>"])
    full = f"{TOKEN} {TOKEN}_1 {TOKEN}_2"
    assert expand_multi_vector_tokens(f"a photo of {TOKEN}", tok) == f"a photo of {full}"
    for alone in ("a red circle", "a photo of <one>", ""):
        assert expand_multi_vector_tokens(alone, tok) == alone

    path = save_embedding(tmp_path / "e.safetensors", torch.randn(3, TEXT_WIDTH))
    pipe = fresh_pipeline(tiny_model_dir)
    pipe.load_textual_inversion(str(path), token=TOKEN)
    for prompt in (f"a photo of {TOKEN}", f"{TOKEN}, red", f"{TOKEN} and {TOKEN}",
                   "a red circle"):
        ours = expand_multi_vector_tokens(prompt, pipe.tokenizer)
        assert ours == pipe.maybe_convert_prompt(prompt, pipe.tokenizer), prompt


# -- 7. the preset ---------------------------------------------------------------------------------
def test_the_ti_preset_trains_to_the_end_with_samples(tmp_path):
    data = load(TI_PRESET).model_dump(mode="json", exclude_none=True)
    data["saving"]["output_dir"] = str(tmp_path / "out")
    data["training"]["log_with"] = "none"
    sink = ListSink()
    result = run(from_dict(data), sink)
    assert result.status == "finished", result.error
    started = sink.of(Started)[0]
    # the sample dataset: 6 images x 10 repeats, batch 2 -> 30 steps/epoch, 2 epochs
    assert (started.steps_per_epoch, started.epochs, started.total_steps) == (30, 2, 60)
    assert result.step == 60
    assert result.output_path == str(tmp_path / "out" / "default-ti.safetensors")
    with safe_open(result.output_path, "pt") as f:
        assert tuple(f.get_tensor("emb_params").shape) == (2, TEXT_WIDTH)
        assert f.metadata()["ti_token_string"] == "<shapes>"
    samples = sink.of(Sample)
    assert [s.step for s in samples] == [30, 60]  # one per epoch
    for sample in samples:
        assert sample.prompts == ("a photo of a <shapes>",) and len(sample.paths) == 1
        assert all(Path(p).is_file() and p.endswith(".png") for p in sample.paths)


@pytest.mark.parametrize("token", ["<a\tb>", "<a\u00a0b>"])
def test_a_token_with_any_white_space_is_refused(token):
    from trainer.config.files import ConfigError, from_dict

    with pytest.raises(ConfigError, match="one word without spaces"):
        from_dict({"mode": "textual_inversion", "network": {"token_string": token}})
