"""The Qwen tokenizers of Z-Image / FLUX.2 klein (Qwen3) and Qwen-Image (Qwen2.5-VL) found as
the CLIP / T5 ones are (issue 31): ``model.tokenizer``, beside the file, the Hugging Face cache,
never the network here; none found is one error naming the setting and the ``hf download``
command. The tiny Qwen tokenizer stands in for the real files in each place."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from trainer.families.common import qwen_tokenizers as qt
from trainer.families.common.tiny_qwen import build_qwen_tokenizer
from trainer.families.sd.tiny import write_tokenizer_files
from trainer.families.spec import ModelLoadError
from trainer.models.tokenizers import TokenizerNotFound

# Qwen2.5's template: a default system prompt, no enable_thinking (wrong for Z-Image / klein)
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}{{- '<|im_start|>system\\nYou are a helpful "
    "assistant.<|im_end|>\\n' -}}{%- endif -%}{%- for message in messages -%}{{- '<|im_start|>' "
    "+ message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def save_qwen(folder: Path, kind: str = "qwen3") -> Path:
    tokenizer = build_qwen_tokenizer()
    if kind == "qwen25vl":
        tokenizer.chat_template = QWEN25_TEMPLATE
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache; ``add(repo, sub, kind)`` puts the tiny tokenizer in it."""
    import huggingface_hub.constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))

    def add(repo: str, sub: str = "", kind: str = "qwen3") -> Path:
        repo_dir = root / ("models--" + repo.replace("/", "--"))
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / "main").write_text("0" * 40)
        return save_qwen(repo_dir / "snapshots" / ("0" * 40) / sub, kind)

    return add


def test_setting_first_a_diffusers_folder_or_the_files(tmp_path, hf_cache):
    hf_cache("Qwen/Qwen3-4B")
    diffusers = save_qwen(tmp_path / "z-image" / "tokenizer").parent
    checkpoint = tmp_path / "models" / "qwen_3_4b.safetensors"
    save_qwen(tmp_path / "models" / "tokenizer")
    assert qt.locate("qwen3", str(diffusers), checkpoint) == qt.Found(
        diffusers / "tokenizer", "model.tokenizer")
    repo = save_qwen(tmp_path / "Qwen3-4B")  # the files themselves
    assert qt.locate("qwen3", str(repo), None).folder == repo


def test_setting_without_a_tokenizer_is_an_error(tmp_path, hf_cache):
    hf_cache("Qwen/Qwen3-4B")  # never reached: the setting is wrong
    write_tokenizer_files(tmp_path / "clip")  # CLIP's vocab.json + merges.txt are not Qwen's
    with pytest.raises(TokenizerNotFound) as caught:
        qt.locate("qwen3", str(tmp_path / "clip"), None)
    message = str(caught.value)
    assert message.startswith(f"model.tokenizer = {str(tmp_path / 'clip')!r}: no Qwen3")
    assert 'hf download Tongyi-MAI/Z-Image-Turbo --include "tokenizer/*"' in message


def test_qwen3_needs_qwen3s_template_and_qwen25vl_takes_either(tmp_path):
    qwen25 = save_qwen(tmp_path / "qwen25", "qwen25vl")
    with pytest.raises(TokenizerNotFound, match="enable_thinking"):
        qt.locate("qwen3", str(qwen25), None)
    assert qt.locate("qwen25vl", str(qwen25), None).folder == qwen25
    qwen3 = save_qwen(tmp_path / "qwen3")
    assert qt.locate("qwen25vl", str(qwen3), None).folder == qwen3


@pytest.mark.parametrize("place", ["name/tokenizer", "tokenizer", "."])
def test_beside_the_file(tmp_path, hf_cache, place):
    hf_cache("Qwen/Qwen-Image", "tokenizer", "qwen25vl")  # the cache comes after
    models = tmp_path / "models"
    folder = save_qwen(models / place.replace("name", "qwen_2.5_vl_7b"), "qwen25vl")
    checkpoint = models / "qwen_2.5_vl_7b.safetensors"
    found = qt.locate("qwen25vl", None, checkpoint)
    assert found.folder == folder and found.where.startswith("beside the file")


def test_each_given_file_is_looked_beside(tmp_path, hf_cache):
    """The text encoder's file first, then the others (the DiT's folder holds it here)."""
    save_qwen(tmp_path / "dit" / "tokenizer")
    write_tokenizer_files(tmp_path / "te" / "tokenizer")  # a CLIP tokenizer: not taken
    found = qt.locate("qwen3", None, [tmp_path / "te" / "qwen_3_4b.safetensors",
                                      tmp_path / "dit" / "z_image_turbo_bf16.safetensors"])
    assert found.folder == tmp_path / "dit" / "tokenizer"


@pytest.mark.parametrize("kind, repo, sub", [
    ("qwen3", "Qwen/Qwen3-4B", ""), ("qwen3", "Tongyi-MAI/Z-Image-Turbo", "tokenizer"),
    ("qwen25vl", "Qwen/Qwen2.5-VL-7B-Instruct", ""), ("qwen25vl", "Qwen/Qwen-Image", "tokenizer")])
def test_hf_cache(tmp_path, hf_cache, kind, repo, sub):
    folder = hf_cache(repo, sub, kind)
    found = qt.locate(kind, None, tmp_path / "models" / "te.safetensors")
    name = f"{repo}/{sub}" if sub else repo
    assert found == qt.Found(folder, f"Hugging Face cache ({name})")


@pytest.mark.parametrize("kind, fetch", [
    ("qwen3", 'hf download Tongyi-MAI/Z-Image-Turbo --include "tokenizer/*"'),
    ("qwen25vl", 'hf download Qwen/Qwen-Image --include "tokenizer/*"')])
def test_none_found_names_the_setting_and_the_command(tmp_path, hf_cache, kind, fetch):
    hf_cache("Qwen/Qwen2.5-VL-7B-Instruct", "", "qwen25vl") if kind == "qwen3" else None
    checkpoint = tmp_path / "models" / "te.safetensors"
    with pytest.raises(ModelLoadError) as caught:
        qt.load_qwen_tokenizer(kind, None, checkpoint)
    message = str(caught.value)
    assert "model.tokenizer" in message and fetch in message
    assert str(tmp_path / "models" / "te" / "tokenizer") in message
    assert "HF_HUB_OFFLINE is set" in message


def test_loaded_tokenizer_is_the_tiny_one(tmp_path):
    folder = save_qwen(tmp_path / "tok")
    tokenizer = qt.load_qwen_tokenizer("qwen3", str(folder), None)
    tiny = build_qwen_tokenizer()
    messages = [{"role": "user", "content": "a red circle"}]
    for thinking in (True, False):
        kwargs = dict(tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
        assert tokenizer.apply_chat_template(messages, **kwargs) == \
            tiny.apply_chat_template(messages, **kwargs)
    text = "<|im_start|>user\na red circle<|im_end|>\n"
    assert tokenizer(text).input_ids == tiny(text).input_ids
    assert tokenizer.pad_token == "<|endoftext|>"


def test_older_saves_vocab_merges_and_template_in_the_config(tmp_path):
    """vocab.json + merges.txt with the template inside tokenizer_config.json (the form of
    the published Qwen repositories before transformers 5)."""
    from trainer.families.common.tiny_qwen import CHAT_TEMPLATE, SPECIALS, vocab_and_merges

    folder = tmp_path / "old"
    folder.mkdir()
    vocab, merges = vocab_and_merges()
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(
        f"{a} {b}" for a, b in merges) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "additional_special_tokens": list(SPECIALS[1:])}), encoding="utf-8")
    tokenizer = qt.load_qwen_tokenizer("qwen3", str(folder), None)
    assert tokenizer("a red circle").input_ids == build_qwen_tokenizer()("a red circle").input_ids


def test_doctor_lists_them(hf_cache, capsys):
    rows = dict(qt.cache_report())
    assert rows == {qt.LABELS[k]: f"tokenizer not found: {qt.FETCH[k]}" for k in qt.LABELS}
    hf_cache("Tongyi-MAI/Z-Image-Turbo", "tokenizer")
    rows = dict(qt.cache_report())
    assert rows[qt.LABELS["qwen3"]] == ("ready, tokenizer from the Hugging Face cache "
                                       "(Tongyi-MAI/Z-Image-Turbo/tokenizer)")
    from trainer.tools import doctor

    report = doctor.build_report()
    assert (qt.LABELS["qwen25vl"], f"tokenizer not found: {qt.FETCH['qwen25vl']}") in \
        report.models
    assert f"{qt.LABELS['qwen3']:<18}ready, tokenizer" in doctor.render(report)
