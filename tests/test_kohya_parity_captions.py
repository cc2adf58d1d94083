"""Issue 21, captions as sd-scripts reads them: weighted captions (AUTOMATIC1111's syntax),
captions of 150 / 225 tokens in 75-token windows, caption_dropout_every_n_epochs and
no_token_padding. The expected windows are built from the tokenizer's own ids of the text, the
expected embeddings by running the encoders on those windows by hand."""

from __future__ import annotations

import random

import pytest
import torch
from train_helpers import one_image_dataset, small_config

from trainer.config import TrainConfig
from trainer.data.captions import CaptionOptions, apply_caption
from trainer.families import family_of
from trainer.families.sd.long_prompts import PromptOptions, token_windows
from trainer.families.sd.weighted_prompts import parse_weights
from trainer.importers.kohya import import_kohya
from trainer.models.loader import load_base_model
from trainer.run.loop import run

LONG = ", ".join(f"red circle {i}" for i in range(40))  # well over 150 tokens


@pytest.fixture(scope="module")
def models():
    out = {}
    for name in ("embedded:tiny-sd15", "embedded:tiny-sdxl"):
        cfg = TrainConfig.model_validate({"model": {"pretrained_model_name_or_path": name}})
        out[name] = load_base_model(cfg.model, torch.float32)
    return out


def test_attention_syntax_as_automatic1111_documents_it():
    assert parse_weights("normal text") == [("normal text", 1.0)]
    assert parse_weights("an (important) word") == [("an ", 1.0), ("important", 1.1),
                                                    (" word", 1.0)]
    assert parse_weights("(unbalanced") == [("unbalanced", 1.1)]
    assert parse_weights(r"\(literal\]") == [("(literal]", 1.0)]
    assert parse_weights("(unnecessary)(parens)") == [("unnecessaryparens", 1.1)]
    got = parse_weights("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).")
    # the first '(' is never closed, so it scales everything after it by 1.1
    want = [("a ", 1.0), ("house", 1.573), (" ", 1.1), ("on", 1.0), (" a ", 1.1),
            ("hill", 0.55), (", sun, ", 1.1), ("sky", 1.4641), (".", 1.1)]
    assert [p for p, _ in got] == [p for p, _ in want]
    assert [w for _, w in got] == pytest.approx([w for _, w in want])
    assert parse_weights("") == [("", 1.0)]


def _expected_windows(tokenizer, text: str, total: int) -> list[list[int]]:
    """sd-scripts' windows written out: the text's tokens cut to ``total``, 75 per window,
    each window BOS + its tokens + the closing ids (all EOS for SD 1.x, whose pad is EOS; for
    the other tokenizers EOS after the end of the text, or after a full window of text, and
    the pad token elsewhere; an empty window starts with EOS)."""
    body = tokenizer(text, add_special_tokens=False).input_ids[:total]
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    windows = []
    for start in range(0, total, 75):
        chunk = body[start:start + 75]
        ended = start + 75 > len(body)  # the text ends inside (or before) this window
        fill = ([eos] if ended else []) + [pad] * 76
        window = [bos] + chunk + fill[: 75 - len(chunk)]
        last = eos if (pad == eos or len(chunk) == 75) else pad
        windows.append(window + [last])
    return windows


@pytest.mark.parametrize("name,slot", [("embedded:tiny-sd15", "tokenizer"),
                                       ("embedded:tiny-sdxl", "tokenizer_2")])
@pytest.mark.parametrize("length", [150, 225])
def test_windows_of_75_tokens(models, name, slot, length):
    tokenizer = getattr(models[name], slot)
    for text in (LONG, "a short one", ""):
        ids, _ = token_windows(tokenizer, [text], PromptOptions(length))
        assert ids.shape == (1, length // 75, 77)
        assert ids[0].tolist() == _expected_windows(tokenizer, text, length), text


def test_sd1_long_weighted_embeddings_by_hand(models):
    model = models["embedded:tiny-sd15"]
    enc, tok = model.text_encoder, model.tokenizer
    text = "a (blue:1.5) square, " + LONG
    model.prompt_options = PromptOptions(150, weighted=True)
    try:
        with torch.no_grad():
            got = family_of(model).encode(model, [text], 1).hidden
    finally:
        model.prompt_options = None
    plain = text.replace("(blue:1.5)", "blue")
    windows = torch.tensor(_expected_windows(tok, plain, 150))
    with torch.no_grad():
        states = enc(windows)[0]  # [2, 77, d]
    want = torch.cat([states[0, :1], states[0, 1:76], states[1, 1:76], states[1, 76:]])
    blue = tok("blue", add_special_tokens=False).input_ids
    assert len(blue) == 1
    position = 1 + len(tok("a", add_special_tokens=False).input_ids)
    assert windows[0, position].item() == blue[0]
    want[position] *= 1.5
    assert got.shape == (1, 152, want.shape[-1])
    assert torch.allclose(got[0], want, atol=1e-5)


def test_sdxl_long_embeddings_and_first_window_pool_by_hand(models):
    model = models["embedded:tiny-sdxl"]
    model.prompt_options = PromptOptions(225)
    try:
        with torch.no_grad():
            got = family_of(model).encode(model, [LONG, "short"], 1)
    finally:
        model.prompt_options = None
    for row, text in enumerate([LONG, "short"]):
        parts, pooled = [], None
        for enc, tok in ((model.text_encoder, model.tokenizer),
                         (model.text_encoder_2, model.tokenizer_2)):
            windows = torch.tensor(_expected_windows(tok, text, 225))
            with torch.no_grad():
                out = enc(windows, output_hidden_states=True)
            s = out.hidden_states[-2]
            parts.append(torch.cat([s[0, :1]] + [s[i, 1:76] for i in range(3)] + [s[2, 76:]]))
            pooled = out[0][0]
        assert torch.allclose(got.hidden[row], torch.cat(parts, dim=-1), atol=1e-5)
        assert torch.allclose(got.pooled[row], pooled, atol=1e-5)


def test_no_token_padding_pads_to_the_longest_caption(models):
    model = models["embedded:tiny-sd15"]
    tok = model.tokenizer
    model.prompt_options = PromptOptions(no_padding=True)
    try:
        with torch.no_grad():
            got = family_of(model).encode(model, ["a red circle", "red"], 1).hidden
    finally:
        model.prompt_options = None
    ids = [tok.bos_token_id] + tok("a red circle", add_special_tokens=False).input_ids + \
        [tok.eos_token_id]
    assert got.shape[1] == len(ids) < 77
    with torch.no_grad():
        assert torch.allclose(got[0], model.text_encoder(torch.tensor([ids]))[0][0], atol=1e-5)


def test_caption_dropout_every_n_epochs_empties_each_nth_epoch():
    ds = TrainConfig.model_validate({"dataset": {"caption_dropout_every_n_epochs": 2}}).dataset
    opts = CaptionOptions.from_config(ds)
    rng = random.Random(0)
    assert [apply_caption("a cat", opts, rng, epoch) for epoch in (1, 2, 3, 4)] == \
        ["a cat", "", "a cat", ""]


def test_refused_combinations_name_the_settings():
    with pytest.raises(ValueError, match="no_token_padding cannot go with dataset.max_token"):
        TrainConfig.model_validate({"dataset": {"no_token_padding": True,
                                                "max_token_length": 150}})
    with pytest.raises(ValueError, match="weighted_captions is set but FLUX.1 does not read it"):
        TrainConfig.model_validate({"model": {"pretrained_model_name_or_path":
                                              "embedded:tiny-flux"},
                                    "dataset": {"weighted_captions": True}})


def test_imported_from_kohya_ss():
    cfg, report = import_kohya({"LoRA_type": "Standard", "weighted_captions": True,
                                "max_token_length": "225", "caption_dropout_every_n_epochs": 3,
                                "no_token_padding": False})
    assert not report.unsupported
    ds = cfg.dataset
    assert (ds.weighted_captions, ds.max_token_length, ds.caption_dropout_every_n_epochs,
            ds.no_token_padding) == (True, 225, 3, False)
    cfg, report = import_kohya({"LoRA_type": "Standard", "max_token_length": 75,
                                "caption_dropout_every_n_epochs": 0})
    assert not report.unsupported and cfg.dataset.max_token_length is None
    assert cfg.dataset.caption_dropout_every_n_epochs is None


@pytest.mark.parametrize("model,dataset", [
    ("embedded:tiny-sd15", {"weighted_captions": True, "max_token_length": 225,
                            "caption_dropout_every_n_epochs": 2}),
    ("embedded:tiny-sdxl", {"weighted_captions": True, "max_token_length": 150}),
    ("embedded:tiny-sd15", {"no_token_padding": True}),
])
def test_two_training_steps(tmp_path, model, dataset):
    data = one_image_dataset(tmp_path / "data", caption="a (red:1.3) circle, " + LONG)
    cfg = small_config(tmp_path, data, model={"pretrained_model_name_or_path": model},
                       dataset=dataset, training={"max_train_steps": 2})
    result = run(cfg)
    assert result.status == "finished", result.error
    assert result.step == 2
