"""Where a single-file model's tokenizer comes from, in order, and what is said when it is nowhere.

The Hugging Face cache is a private folder per test laid out as the hub lays it out
(``models--org--name/refs/main``, ``snapshots/<commit>/...``), filled with the tiny tokenizer's
files; sockets are closed, so a look-up that tried the network would fail the test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.config import ModelSection
from trainer.families.sd.checkpoint import save_checkpoint
from trainer.families.sd.detect import FAMILIES
from trainer.families.sd.tiny import build_components, save_tiny_model, write_tokenizer_files
from trainer.models import tokenizers
from trainer.models.loader import ModelLoadError, load_base_model
from trainer.models.tokenizers import FETCH, Found, TokenizerNotFound, locate

SD1, SD2, SDXL = FAMILIES["sd1"], FAMILIES["sd2"], FAMILIES["sdxl"]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache; ``add(repo, sub)`` puts the tiny tokenizer files in it."""
    import huggingface_hub.constants

    root = tmp_path / "hf-cache"
    root.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))

    def add(repo: str, sub: str = "") -> Path:
        repo_dir = root / ("models--" + repo.replace("/", "--"))
        (repo_dir / "refs").mkdir(parents=True)
        (repo_dir / "refs" / "main").write_text("0" * 40)
        return write_tokenizer_files(repo_dir / "snapshots" / ("0" * 40) / sub)

    add.root = root
    return add


def test_setting_comes_first_and_must_hold_a_tokenizer(tmp_path, hf_cache):
    hf_cache(tokenizers.CLIP_L)
    setting = write_tokenizer_files(tmp_path / "mine")
    checkpoint = tmp_path / "m.safetensors"
    write_tokenizer_files(tmp_path / "m" / "tokenizer")
    found = locate(SD1, SD1.encoders[0], str(setting), checkpoint)
    assert found == Found(setting, "model.tokenizer")
    # a diffusers-style folder: tokenizer/ and tokenizer_2/ inside
    write_tokenizer_files(tmp_path / "xl" / "tokenizer")
    write_tokenizer_files(tmp_path / "xl" / "tokenizer_2")
    assert locate(SDXL, SDXL.encoders[1], str(tmp_path / "xl"), None).folder == \
        tmp_path / "xl" / "tokenizer_2"
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerNotFound, match=r"model\.tokenizer = .*empty.*no tokenizer"):
        locate(SD1, SD1.encoders[0], str(tmp_path / "empty"), checkpoint)


def test_beside_the_file_the_model_folder_comes_before_the_shared_one(tmp_path, hf_cache):
    hf_cache(tokenizers.CLIP_L)
    checkpoint = tmp_path / "m.safetensors"
    shared = write_tokenizer_files(tmp_path / "tokenizer")
    assert locate(SD1, SD1.encoders[0], None, checkpoint).folder == shared
    own = write_tokenizer_files(tmp_path / "m" / "tokenizer")
    found = locate(SD1, SD1.encoders[0], None, checkpoint)
    assert found.folder == own and found.where.startswith("beside the file")


def test_the_hugging_face_cache_family_repos_first(tmp_path, hf_cache):
    checkpoint = tmp_path / "m.safetensors"
    hf_cache(tokenizers.CLIP_L)
    found = locate(SD2, SD2.encoders[0], None, checkpoint)
    assert found.where == f"Hugging Face cache ({tokenizers.CLIP_L})"
    hf_cache("stabilityai/stable-diffusion-2", "tokenizer")
    found = locate(SD2, SD2.encoders[0], None, checkpoint)
    assert found.where == "Hugging Face cache (stabilityai/stable-diffusion-2/tokenizer)"
    # the vocabulary is shared: SD 2.x from CLIP ViT-L's copy still pads as OpenCLIP does
    clip_l = tokenizers.load(locate(SD1, SD1.encoders[0], None, checkpoint), "!")
    assert clip_l.pad_token == "!" and clip_l.pad_token_id == 0
    assert clip_l.model_max_length == 77


def test_offline_and_nowhere_names_the_slot_and_the_command(tmp_path, hf_cache):
    checkpoint = tmp_path / "xl.safetensors"
    write_tokenizer_files(tmp_path / "tokenizer")  # SDXL's first slot is found beside
    assert locate(SDXL, SDXL.encoders[0], None, checkpoint)
    with pytest.raises(TokenizerNotFound) as info:
        locate(SDXL, SDXL.encoders[1], None, checkpoint, fetch=lambda: pytest.fail("online"))
    message = str(info.value)
    assert "SDXL needs a CLIP tokenizer (tokenizer_2)" in message
    assert str(tmp_path / "xl" / "tokenizer_2") in message
    assert "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k" in message
    assert "HF_HUB_OFFLINE is set" in message and f"`{FETCH}`" in message


def test_online_only_when_the_hub_is_not_offline(tmp_path, hf_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    fetched = Found(write_tokenizer_files(tmp_path / "dl"), "downloaded")
    calls = []
    assert locate(SD1, SD1.encoders[0], None, None,
                  fetch=lambda: calls.append(1) or fetched) == fetched
    assert calls == [1]

    def broken():
        raise OSError("no route to host")

    with pytest.raises(TokenizerNotFound, match="The download failed: no route to host"):
        locate(SD1, SD1.encoders[0], None, None, fetch=broken)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(TokenizerNotFound, match="HF_HUB_OFFLINE"):
        locate(SD1, SD1.encoders[0], None, None, fetch=lambda: pytest.fail("online"))


def test_the_fetch_command_is_one_the_installed_hub_has():
    program, command, repo, *files = FETCH.split()
    hf = Path(sys.executable).with_name(program)
    assert hf.is_file() or shutil.which(program)
    done = subprocess.run([str(hf) if hf.is_file() else program, command, "--help"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and "FILENAMES" in done.stdout
    assert repo == tokenizers.CLIP_L and files == list(tokenizers.FILES)


def test_loader_finds_the_tokenizer_beside_the_file_or_says_what_to_run(tmp_path, hf_cache):
    folder = save_tiny_model(tmp_path / "tiny")
    parts = build_components()
    path = save_checkpoint(tmp_path / "models" / "m.safetensors", parts["unet"], parts["vae"],
                           parts["text_encoder"], dtype=torch.float32)
    section = ModelSection(pretrained_model_name_or_path=str(path), config_dir=str(folder))
    with pytest.raises(ModelLoadError) as info:
        load_base_model(section)
    message = str(info.value)
    assert message.startswith(f"model.pretrained_model_name_or_path = {str(path)!r}: ")
    assert "SD 1.x needs a CLIP tokenizer (tokenizer)" in message and FETCH in message
    write_tokenizer_files(tmp_path / "models" / "m" / "tokenizer")
    model = load_base_model(section)
    assert model.tokenizer("a red circle").input_ids == parts["tokenizer"]("a red circle"
                                                                           ).input_ids


def test_doctor_rows_say_which_families_load_offline(hf_cache):
    rows = dict(tokenizers.cache_report())
    assert rows == {label: f"tokenizer not found: {FETCH}"
                    for label in ("SD 1.x", "SD 2.x", "SDXL")}
    hf_cache(tokenizers.CLIP_L)
    rows = dict(tokenizers.cache_report())
    assert set(rows.values()) == {
        f"ready, tokenizer from the Hugging Face cache ({tokenizers.CLIP_L})"}
